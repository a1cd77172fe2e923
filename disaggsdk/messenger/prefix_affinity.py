"""Which target probably holds a prompt's prefix: an index of what was routed where, and the policy
that weighs it against load.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

POLICIES = ("cache_aware", "least_loaded")


class PrefixIndex:
    """Page hashes sent to each target recently, least recently routed evicted first.

    Args:
        capacity_pages: pages remembered per target unless `set_capacity` says otherwise (about
            the target's KV pages: a target cannot cache more than it holds).
    Raises:
        ValueError: ``capacity_pages`` below 1.
    """

    def __init__(self, capacity_pages: int):
        self.capacity_pages = _positive(capacity_pages)
        self._capacity: dict[str, int] = {}
        self._pages: dict[str, OrderedDict[bytes, None]] = {}  # per target, oldest first

    def set_capacity(self, target: str, capacity_pages: int) -> None:
        """Bound ``target``'s pages (evicting at once if it holds more)."""
        self._capacity[target] = _positive(capacity_pages)
        self._evict(target)

    def add(self, target: str, hashes: Sequence[bytes]) -> None:
        """Remember that a prompt with these page hashes was sent to ``target``."""
        pages = self._pages.setdefault(target, OrderedDict())
        # last page first, so page 0 is the most recent: eviction takes the tails of old prompts
        # first and leaves their prefixes matchable, as an engine's cache frees a request's pages
        for h in reversed(hashes):
            pages[h] = None
            pages.move_to_end(h)
        self._evict(target)

    def matched_pages(self, target: str, hashes: Sequence[bytes]) -> int:
        """How many of the prompt's first pages ``target`` was sent (0 for a target never seen)."""
        pages = self._pages.get(target)
        if not pages:
            return 0
        n = 0
        for h in hashes:
            if h not in pages:
                break
            n += 1
        return n

    def num_pages(self, target: str) -> int:
        """Pages remembered for ``target``."""
        return len(self._pages.get(target, ()))

    def forget(self, target: str) -> None:
        """Drop everything sent to ``target`` (it died or restarted: its cache is gone)."""
        self._pages.pop(target, None)

    def _evict(self, target: str) -> None:
        pages = self._pages.get(target)
        if pages is None:
            return
        capacity = self._capacity.get(target, self.capacity_pages)
        while len(pages) > capacity:
            pages.popitem(last=False)


@dataclass(frozen=True)
class Decision:
    """One choice: the target, and how many of the prompt's full pages it was found to hold."""

    target: str
    matched_pages: int
    prompt_pages: int


class RoutingPolicy:
    """Choose a target for each request by a named policy (see the module docstring).

    Args:
        name: ``"cache_aware"`` or ``"least_loaded"``.
        index: what was routed where; a fresh one holding ``capacity_pages`` per target if None.
        capacity_pages: pages per target of a fresh index.
        overlap_weight: cache_aware's weight of a page to prefill against a page in flight
            (Dynamo's ``kv-overlap-score-weight``): higher keeps prefixes together longer under
            uneven load, lower balances sooner.
    Raises:
        ValueError: an unknown ``name``, or a negative ``overlap_weight``.
    """

    def __init__(self, name: str, index: PrefixIndex | None = None, capacity_pages: int = 1 << 16,
                 overlap_weight: float = 1.0):
        if name not in POLICIES:
            raise ValueError(f"unknown routing policy {name!r}; use one of {', '.join(POLICIES)}")
        if overlap_weight < 0:
            raise ValueError(f"overlap_weight must be >= 0, got {overlap_weight}")
        self.name = name
        self.index = index if index is not None else PrefixIndex(capacity_pages)
        self.overlap_weight = overlap_weight
        self.last: Decision | None = None  # the latest `choose`, for tests and metrics

    @property
    def last_matched_pages(self) -> int:
        """Pages of the latest chosen target's prompt found on it (0 before any choice)."""
        return self.last.matched_pages if self.last is not None else 0

    def choose(self, candidates: Sequence[str], hashes: Sequence[bytes], load: Mapping[str, int]) -> str:
        """The target for a prompt; call `routed` once it is sent there.

        Args:
            candidates: the targets that may take it (healthy ones), in any order.
            hashes: the prompt's page hashes (`page_hashes(prompt_ids, page_size)`); empty is fine.
            load: requests in flight per target (a candidate missing here counts as 0).
        Returns:
            One of ``candidates``.
        Raises:
            ValueError: no candidates.
        """
        if not candidates:
            raise ValueError("no candidate targets to choose from")
        matched = {t: self.index.matched_pages(t, hashes) for t in candidates}
        if self.name == "least_loaded" or not any(matched.values()):
            target = min(candidates, key=lambda t: (load.get(t, 0), t))
        else:
            target = min(candidates, key=lambda t: (self._cost(len(hashes), matched[t], load.get(t, 0)),
                                                    load.get(t, 0), t))
        self.last = Decision(target, matched[target], len(hashes))
        return target

    def routed(self, target: str, hashes: Sequence[bytes]) -> None:
        """Record that a prompt with these page hashes went to ``target``."""
        self.index.add(target, hashes)

    def forget(self, target: str) -> None:
        """Drop what was routed to ``target`` (it died or restarted)."""
        self.index.forget(target)

    def _cost(self, prompt_pages: int, matched_pages: int, num_in_flight: int) -> float:
        new_pages = prompt_pages - matched_pages
        active_pages = num_in_flight * prompt_pages + new_pages
        return self.overlap_weight * new_pages + active_pages


def _positive(capacity_pages: int) -> int:
    if capacity_pages < 1:
        raise ValueError(f"capacity_pages must be >= 1, got {capacity_pages}")
    return capacity_pages
