"""An engine's prefix cache (vLLM's automatic prefix caching) over its page allocator.

A new request first takes the cached pages of its prompt's longest cached prefix (never all it
must compute: its last token always is) and prefills from there; each page whose tokens are all
computed is offered to the cache, when the step computed it and at the latest before the request
lets its pages go. Pages are keyed by chained hashes of their tokens (`kv.block_hash`), with
MTP drafting one token further (``hash_lookahead``: the MTP KV at a page's end read the next token).
With tiers attached (`kv.tiers`), evicted pages go down to them and a prefix found there is loaded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from disaggsdk.kv.block_hash import cacheable_tokens, extend_page_hashes, page_hashes
from disaggsdk.kv.page_allocator import PageAllocator

if TYPE_CHECKING:
    from disaggsdk.kv.tiers.tier_stack import TierStack


class PageBytes(Protocol):
    """A pool's pages as bytes, for the tiers (`engine.kv_tier_pages.PoolPages` is one)."""

    page_bytes: int

    def read(self, page_id: int) -> bytes:
        """The page's bytes."""

    def write(self, page_id: int, data: bytes | memoryview) -> None:
        """Overwrite the page with ``data`` (from `read`)."""


class PromptLogprobsParams(Protocol):
    """What the prefix cache reads of a request's sampling parameters."""

    @property
    def prompt_logprobs(self) -> int | None:
        """Prompt logprobs asked for: every prompt position must be computed, none taken from the cache."""


class CachedRequest(Protocol):
    """What the prefix cache reads and updates of a request (`engine.sequence.Request` is one)."""

    num_computed_tokens: int  # tokens whose KV is in its pages (cached ones included)
    num_preemptions: int
    page_hashes: list[bytes]  # chained hashes of its full pages so far (`block_hash.extend_page_hashes`)
    num_pages_cached: int  # its first pages already offered to (or taken from) the cache
    num_cached_tokens: int  # prompt tokens its first lookup found

    @property
    def request_id(self) -> str:
        """The owner of its pages in the allocator."""

    @property
    def prompt_ids(self) -> list[int]:
        """Its prompt."""

    @property
    def all_ids(self) -> list[int]:
        """Prompt and output tokens, in order."""

    @property
    def params(self) -> PromptLogprobsParams:
        """Its sampling parameters."""


class PrefixCache:
    """Which pages a prompt can share, which computed pages to offer, and the query/hit counters.

    Args:
        allocator: the engine's page allocator (it holds the hash -> page index).
        page_size: tokens per page.
        enabled: with False every lookup finds nothing and nothing is offered.
        hash_lookahead: tokens after a page its key covers too (`config.hash_lookahead`).
    """

    def __init__(self, allocator: PageAllocator, page_size: int, enabled: bool, hash_lookahead: int = 0):
        self.allocator = allocator
        self.page_size = page_size
        self.enabled = enabled
        self.hash_lookahead = hash_lookahead
        self.queries = self.hits = 0  # vLLM's prefix_cache_queries / _hits, in prompt tokens
        self.tier_hits = 0  # of ``hits``, the tokens loaded from a tier (vLLM's external_prefix_cache_hits)
        self.tiers: TierStack | None = None
        self._pages: PageBytes | None = None

    def attach_tiers(self, tiers: TierStack, pages: PageBytes) -> None:
        """Keep pages past the pool in ``tiers``: each evicted page's bytes (``pages`` reads them) go down to
        them (and, written through, each newly cached page's), and a lookup loads the prefix they hold
        after the pool's own into fresh pages."""
        self.tiers, self._pages = tiers, pages
        self.allocator.cache.on_evict = self._on_evict

    def share_prefix(self, req: CachedRequest, target_tokens: int) -> int:
        """Give a new request (``target_tokens`` to compute in all) the cached pages of its longest
        cached prefix; returns their tokens. Counted by `count_lookup` once it is admitted."""
        if not self.enabled or req.num_computed_tokens or req.params.prompt_logprobs is not None:
            return 0  # prompt logprobs need every prompt position computed (vLLM skips the cache too)
        limit = cacheable_tokens(target_tokens, self.page_size) // self.page_size
        extend_page_hashes(req.page_hashes, req.all_ids, self.page_size, limit, lookahead=self.hash_lookahead)
        req.num_pages_cached = self._share(req.request_id, req.page_hashes[:limit])
        req.num_computed_tokens = req.num_pages_cached * self.page_size
        return req.num_computed_tokens

    def count_lookup(self, req: CachedRequest, hit: int) -> None:
        """Count an admitted request's lookup (``hit`` tokens found), once: a recompute after a
        preemption is not a new query, and the request's usage keeps its first hit."""
        if self.enabled and not req.num_preemptions:
            self._count(len(req.prompt_ids), hit)
            req.num_cached_tokens = hit

    def share_prompt(self, request_id: str, prompt_ids: Sequence[int], count: bool = True) -> int:
        """As `share_prefix` does, for a request whose KV arrives from elsewhere (a decode unit's):
        the cached pages of ``prompt_ids[:-1]``'s longest cached prefix. Returns how many."""
        if not self.enabled:
            return 0
        num_pages = self._share(request_id, self._prompt_hashes(prompt_ids))
        if count:
            self._count(len(prompt_ids), num_pages * self.page_size)
        return num_pages

    def cached_pages(self, prompt_ids: Sequence[int]) -> int:
        """How many pages of ``prompt_ids[:-1]``'s longest cached prefix the cache holds now, taking
        none of them and counting no query (a decode unit choosing where to prefill)."""
        if not self.enabled:
            return 0
        hashes = self._prompt_hashes(prompt_ids)
        on_device = len(self.allocator.lookup(hashes))
        return on_device + (self.tiers.num_cached_prefix(hashes[on_device:]) if self.tiers is not None else 0)

    def cache_computed(self, req: CachedRequest) -> int:
        """Offer the request's pages whose tokens are all computed to the cache. Returns how many
        were newly cached (pages whose tokens another page already holds stay private)."""
        if not self.enabled:
            return 0
        full = req.num_computed_tokens // self.page_size
        if full <= req.num_pages_cached:
            return 0
        extend_page_hashes(req.page_hashes, req.all_ids, self.page_size, full, lookahead=self.hash_lookahead)
        full = min(full, len(req.page_hashes))  # with a lookahead, the last page waits for its next token
        pages = self.allocator.page_ids(req.request_id)[req.num_pages_cached : full]
        hashes = req.page_hashes[req.num_pages_cached : full]
        added = self.allocator.cache_pages(pages, hashes)
        req.num_pages_cached = full
        if added and self.tiers is not None and self.tiers.write_policy == "write_through":
            assert self._pages is not None
            for page, page_hash in zip(pages, hashes):
                if self.allocator.lookup([page_hash]) == [page]:  # the shared copy is this one
                    self.tiers.offer_computed(page_hash, self._pages.read(page))
        return added

    def _prompt_hashes(self, prompt_ids: Sequence[int]) -> list[bytes]:
        """The page hashes of ``prompt_ids[:-1]``'s full pages, keyed as this engine caches them."""
        max_pages = (len(prompt_ids) - 1) // self.page_size
        return page_hashes(list(prompt_ids), self.page_size, max_pages, lookahead=self.hash_lookahead)

    def _share(self, owner: str, hashes: list[bytes]) -> int:
        pages = self.allocator.lookup(hashes)
        self.allocator.share(owner, pages)
        if self.tiers is None or len(pages) == len(hashes):
            return len(pages)
        return len(pages) + self._load(owner, hashes[len(pages):])

    def _load(self, owner: str, hashes: list[bytes]) -> int:
        """Load the longest prefix of ``hashes`` the tiers hold into fresh pages of ``owner`` (after the
        pages it holds), cached under those hashes; returns how many. A page that does not load (gone,
        or failing its checks) ends the prefix: the rest is computed."""
        assert self.tiers is not None and self._pages is not None
        wanted = self.tiers.num_cached_prefix(hashes)
        if not wanted or not self.allocator.can_allocate(wanted):
            return 0  # never evict the pool's own pages to load a tier's
        held = len(self.allocator.page_ids(owner))
        pages = list(self.allocator.allocate(owner, wanted).page_ids)
        loaded = 0
        for page, page_hash in zip(pages, hashes):
            data = self.tiers.load(page_hash)
            if data is None:
                break
            self._pages.write(page, data)
            loaded += 1
        self.allocator.truncate(owner, held + loaded)
        self.allocator.cache_pages(pages[:loaded], hashes[:loaded])
        self.tier_hits += loaded * self.page_size
        return loaded

    def _on_evict(self, page_id: int, page_hash: bytes) -> None:
        assert self.tiers is not None and self._pages is not None
        self.tiers.offer_evicted(page_hash, self._pages.read(page_id))

    def _count(self, num_prompt_tokens: int, num_hit_tokens: int) -> None:
        self.queries += num_prompt_tokens
        self.hits += num_hit_tokens
