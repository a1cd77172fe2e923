"""The prefix cache's index: which pages hold which full page of tokens, and which may be evicted.

vLLM's design, on page ids: a page whose tokens are all computed is *cached* under its chained
hash (`block_hash.page_hashes`); another request whose prompt starts with the same pages shares
it instead of computing it again. A cached page nobody holds any more stays cached but
*evictable*, in least-recently-released order; the allocator takes evictable pages (dropping
their hash, so no later lookup can find their old content) only when the free list is empty.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence


class PageCache:
    """Hash <-> page maps and the LRU of cached pages with no holder."""

    def __init__(self) -> None:
        self._page_of_hash: dict[bytes, int] = {}
        self._hash_of_page: dict[int, bytes] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest release first
        self.num_evictions = 0  # since start
        # told each page the allocator evicts, before its bytes are reused (`PrefixCache.attach_tiers`)
        self.on_evict: Callable[[int, bytes], None] | None = None

    @property
    def num_cached_pages(self) -> int:
        return len(self._hash_of_page)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def is_cached(self, page_id: int) -> bool:
        return page_id in self._hash_of_page

    def is_evictable(self, page_id: int) -> bool:
        return page_id in self._evictable

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The pages of the longest cached prefix of ``hashes`` (page i holds hash i)."""
        out = []
        for h in hashes:
            page = self._page_of_hash.get(h)
            if page is None:
                break
            out.append(page)
        return out

    def insert(self, page_id: int, page_hash: bytes) -> bool:
        """Cache ``page_id`` under ``page_hash``. False (nothing changes) when the hash is cached
        already (another request computed the same tokens: the first copy stays the shared one) or
        the page holds another hash."""
        if page_hash in self._page_of_hash or page_id in self._hash_of_page:
            return False
        self._page_of_hash[page_hash] = page_id
        self._hash_of_page[page_id] = page_hash
        return True

    def park(self, page_id: int) -> None:
        """A cached page lost its last holder: evictable, most recently released."""
        self._evictable[page_id] = None

    def unpark(self, page_id: int) -> None:
        """A request shares an evictable page again: it may not be evicted while held."""
        self._evictable.pop(page_id, None)

    def evict(self) -> int:
        """Forget the least recently released evictable page's hash and return the page.

        Raises:
            KeyError: nothing is evictable.
        """
        page_id, _ = self._evictable.popitem(last=False)
        page_hash = self._hash_of_page.pop(page_id)
        del self._page_of_hash[page_hash]
        self.num_evictions += 1
        if self.on_evict is not None:
            self.on_evict(page_id, page_hash)
        return page_id

    def clear_evictable(self) -> list[int]:
        """Forget every evictable page (vLLM's reset_prefix_cache); returns them, to be freed."""
        pages = list(self._evictable)
        self._evictable.clear()
        for page_id in pages:
            del self._page_of_hash[self._hash_of_page.pop(page_id)]
        self.num_evictions += len(pages)  # forgotten, not kept: no tier is told
        return pages
