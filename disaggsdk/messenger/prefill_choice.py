"""Where a handed-off prompt is prefilled: here, or on which prefill unit.

Conditional disaggregation (Dynamo's): a prompt with at most ``$.transfer.max_local_prefill_tokens``
tokens missing from this decode unit's prefix cache is prefilled here, in the decode engine's own
chunked prefill, with no handoff: for a short suffix after a cached history the hops and the
separate first decode step cost more than the stall the running requests take. Every other prompt
goes to the prefill unit ``serve.routing`` picks (`prefix_affinity.RoutingPolicy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from disaggsdk.kv.block_hash import page_hashes
from disaggsdk.messenger.handoff import Handoff
from disaggsdk.messenger.ports import DecodeEngine
from disaggsdk.messenger.prefix_affinity import RoutingPolicy

if TYPE_CHECKING:
    from disaggsdk.spec.serving_types import Routing


def scores_prompt(h: Handoff) -> bool:
    """Whether ``h`` asks for prompt logprobs: a prefill unit then computes (scores) its prompt whole,
    never from a cache (as vLLM skips the cache for them)."""
    return h.params is not None and h.params.prompt_logprobs is not None


class PrefillChoice:
    """Chooses, for one decode unit, where each handed-off prompt is prefilled.

    Args:
        engine: the decode unit's engine (its prefix cache is asked what it holds).
        routing: ``serve.routing``, as `RoutingPolicy` takes it.
        capacity_pages: a unit's KV pages (the cache-aware policy's capacity).
        max_local_prefill_tokens: ``$.transfer.max_local_prefill_tokens`` (0: never here).
    """

    def __init__(self, engine: DecodeEngine, routing: Routing, capacity_pages: int, max_local_prefill_tokens: int):
        self.engine = engine
        self.page_size = engine.config.page_size
        self.policy = RoutingPolicy(routing, capacity_pages=capacity_pages)
        self.max_local_prefill_tokens = max_local_prefill_tokens

    def cached_pages_if_short(self, h: Handoff) -> int | None:
        """The cached pages of ``h``'s prompt when few enough of its tokens are missing from the cache
        for its first attempt to be prefilled here; None when it goes to a prefill unit."""
        if h.attempt or scores_prompt(h) or self.max_local_prefill_tokens <= 0:
            return None
        cached_pages = self.engine.kv.cached_prompt_pages(h.prompt_ids)
        short = len(h.prompt_ids) - 1 - cached_pages * self.page_size <= self.max_local_prefill_tokens
        return cached_pages if short else None

    def prefill_unit(self, h: Handoff, live: Sequence[str], outstanding: Mapping[str, int]) -> str | None:
        """The prefill unit for ``h`` among ``live`` (those up and not yet tried for it): the one that
        was sent its prefix (its cache may hold it) against the fewest ``outstanding`` requests, or
        just the fewest. None when none is left."""
        if not live:
            return None
        hashes = page_hashes(h.prompt_ids[:-1], self.page_size) if self.policy.name == "cache_aware" else []
        name = self.policy.choose(list(live), hashes, outstanding)
        self.policy.routed(name, hashes)
        return name

    def forget(self, name: str) -> None:
        """Prefill unit ``name``'s prefix cache is empty (a restart, a reset): forget what it was sent."""
        self.policy.forget(name)
