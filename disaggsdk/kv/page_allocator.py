"""Which KV pages belong to whom: a free list, per-owner page lists, pins and grant generations.

Pure Python, no torch: the same allocator serves every rank of an instance (all ranks hold the
same page ids), and the messenger uses it on the decode side to grant pages to remote writers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from disaggsdk.errors import DisaggError
from disaggsdk.kv.page_cache import PageCache


class OutOfPagesError(DisaggError):
    """Not enough free KV pages for a request."""


class PageOwnershipError(DisaggError):
    """A page operation names an owner or page that does not hold it."""


@dataclass(frozen=True)
class PageGrant:
    """Pages granted to one owner in one allocation.

    ``generation`` is unique per allocation call; ``PageAllocator.is_current`` tells whether the
    pages still belong to this grant.
    """

    owner: str
    page_ids: tuple[int, ...]
    generation: int


class PageAllocator:
    """Free list over ``num_pages`` pages with per-owner bookkeeping.

    Args:
        num_pages: pages in the pool (ids 0 .. num_pages - 1).
    """

    def __init__(self, num_pages: int):
        if num_pages < 1:
            raise OutOfPagesError(f"a KV pool needs at least one page, got num_pages={num_pages}")
        self.num_pages = num_pages
        self._free_page_ids: deque[int] = deque(range(num_pages))
        self._page_ids_of: dict[str, list[int]] = {}
        self._generation_of_page = [0] * num_pages  # 0: never granted
        self._pinned_owners: set[str] = set()
        self._next_generation = 1
        self._refs = [0] * num_pages  # owners holding each page
        self.cache = PageCache()

    # queries

    @property
    def num_free_pages(self) -> int:
        """Pages an allocation can take now: free ones and cached ones nobody holds."""
        return len(self._free_page_ids) + self.cache.num_evictable

    def can_allocate(self, num_pages: int) -> bool:
        """True when ``num_pages`` pages are free now."""
        return num_pages <= self.num_free_pages

    def num_holders(self, page_id: int) -> int:
        """How many owners hold ``page_id`` (0: free or evictable)."""
        return self._refs[page_id]

    def page_ids(self, owner: str) -> list[int]:
        """The pages ``owner`` holds, in allocation order (a copy; empty when none)."""
        return list(self._page_ids_of.get(owner, ()))

    def owners(self) -> list[str]:
        """Owners holding at least one page, in first-allocation order."""
        return list(self._page_ids_of)

    def is_pinned(self, owner: str) -> bool:
        """True when ``owner``'s pages are non-evictable (remote writes may land in them)."""
        return owner in self._pinned_owners

    def is_current(self, grant: PageGrant) -> bool:
        """True while every page of ``grant`` still belongs to that grant (not freed or reused)."""
        held = set(self._page_ids_of.get(grant.owner, ()))
        return all(
            p in held and self._generation_of_page[p] == grant.generation for p in grant.page_ids
        )

    # allocate / free

    def allocate(self, owner: str, num_pages: int, pinned: bool = False) -> PageGrant:
        """Give ``num_pages`` more pages to ``owner`` (appended to its list).

        Args:
            owner: a request id.
            num_pages: pages to add (0 gives an empty grant).
            pinned: make the owner non-evictable until ``unpin``.
        Returns:
            The grant of the new pages.
        Raises:
            OutOfPagesError: fewer than ``num_pages`` pages are free; nothing is allocated.
        """
        if num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {num_pages}")
        if num_pages > self.num_free_pages:
            raise OutOfPagesError(
                f"{owner}: needs {num_pages} KV pages but {self.num_free_pages} of "
                f"{self.num_pages} are free; raise num_pages or lower max_num_seqs / prompt length"
            )
        generation = self._next_generation
        self._next_generation += 1
        # free pages first; cached pages nobody holds only when none is left (vLLM's order)
        new = [self._free_page_ids.popleft() if self._free_page_ids else self.cache.evict() for _ in range(num_pages)]
        for p in new:
            self._generation_of_page[p] = generation
            self._refs[p] = 1
        self._page_ids_of.setdefault(owner, []).extend(new)
        if pinned:
            self._pinned_owners.add(owner)
        return PageGrant(owner=owner, page_ids=tuple(new), generation=generation)

    def truncate(self, owner: str, num_pages: int) -> int:
        """Keep ``owner``'s first ``num_pages`` pages and free the rest (the tail a rolled-back
        speculation no longer needs). Returns the number freed."""
        pages = self._page_ids_of.get(owner, [])
        tail = pages[num_pages:]
        del pages[num_pages:]
        self._release(tail)
        return len(tail)

    def free(self, owner: str) -> int:
        """Return every page of ``owner`` to the free list and forget its pin.

        Returns:
            The number of pages freed (0 for an unknown owner, so a late or duplicate free is
            harmless).
        """
        pages = self._page_ids_of.pop(owner, [])
        self._pinned_owners.discard(owner)
        self._release(pages)
        return len(pages)

    def _release(self, pages: list[int]) -> None:
        for p in pages:
            self._refs[p] -= 1
            if self._refs[p] > 0:
                continue  # another request still reads it
            if self.cache.is_cached(p):
                self.cache.park(p)
            else:
                self._free_page_ids.append(p)

    # the prefix cache

    def lookup(self, page_hashes: list[bytes]) -> list[int]:
        """The cached pages holding the longest prefix of ``page_hashes`` (see `block_hash`)."""
        return self.cache.lookup(page_hashes)

    def share(self, owner: str, page_ids: list[int]) -> None:
        """Add cached pages (from `lookup`) to ``owner``'s list: one more holder each, and none of
        them evictable while held. Call before the owner's other pages: they hold its first tokens.

        Raises:
            PageOwnershipError: a page is not cached (only pages under a hash may be shared).
        """
        for p in page_ids:
            if not self.cache.is_cached(p):
                raise PageOwnershipError(f"{owner}: page {p} is not in the prefix cache; only cached pages are shared")
        for p in page_ids:
            self._refs[p] += 1
            self.cache.unpark(p)
        self._page_ids_of.setdefault(owner, []).extend(page_ids)

    def cache_pages(self, page_ids: list[int], page_hashes: list[bytes]) -> int:
        """Cache held pages whose every token is computed under their hashes (``page_ids[i]`` holds
        ``page_hashes[i]``). Returns how many were newly cached."""
        return sum(self.cache.insert(p, h) for p, h in zip(page_ids, page_hashes) if self._refs[p] > 0)

    def reset_cache(self) -> int:
        """Forget every cached page nobody holds (they become free). Returns their count."""
        pages = self.cache.clear_evictable()
        self._free_page_ids.extend(pages)
        return len(pages)

    def rename(self, owner: str, new_owner: str) -> int:
        """Hand every page of ``owner`` to ``new_owner`` (generations and pin kept).

        The messenger parks a retried request's pages under a quarantine owner until no late
        write can land in them, while the request itself gets fresh pages.

        Returns:
            The number of pages moved (0 for an unknown owner).
        Raises:
            PageOwnershipError: ``new_owner`` already holds pages.
        """
        if new_owner in self._page_ids_of:
            raise PageOwnershipError(f"{new_owner}: already holds KV pages; pick an unused owner name")
        pages = self._page_ids_of.pop(owner, None)
        if pages is None:
            return 0
        self._page_ids_of[new_owner] = pages
        if owner in self._pinned_owners:
            self._pinned_owners.discard(owner)
            self._pinned_owners.add(new_owner)
        return len(pages)

    def pin(self, owner: str) -> None:
        """Make ``owner``'s pages non-evictable.

        Raises:
            PageOwnershipError: the owner holds no pages.
        """
        if owner not in self._page_ids_of:
            raise PageOwnershipError(f"{owner}: holds no KV pages, nothing to pin")
        self._pinned_owners.add(owner)

    def unpin(self, owner: str) -> None:
        """Let ``owner``'s pages be evicted again (no-op when not pinned)."""
        self._pinned_owners.discard(owner)
