"""Continuous batching with chunked prefill under a per-step token budget.

Each step takes, in order: one token for every decoding request, then prefill chunks (unfinished
prefills first, then new requests) until ``max_num_batched_tokens`` is spent. When a decode needs
a page and none is free, the most recently admitted evictable request is preempted: its pages
are freed and it waits to be recomputed from its tokens (prompt and output so far).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from disaggsdk.engine.sequence import Request, RequestStatus
from disaggsdk.kv.page_allocator import PageAllocator
from disaggsdk.kv.prefix_cache import PrefixCache

Mode = Literal["mixed", "prefill_only", "decode_only"]
MODES = ("mixed", "prefill_only", "decode_only")


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens ``[start_pos, start_pos + num_tokens)`` of a request run this step."""

    request: Request
    start_pos: int
    num_tokens: int
    page_ids: tuple[int, ...]  # all the request's pages after this step's allocation
    sample: bool  # the chunk reaches the last known token: a new token is sampled from it
    # speculative drafts after the last known token (counted in num_tokens): verified this step
    draft_ids: tuple[int, ...] = ()

    @property
    def token_ids(self) -> list[int]:
        known = self.num_tokens - len(self.draft_ids)
        return self.request.all_ids[self.start_pos : self.start_pos + known] + list(self.draft_ids)

    @property
    def is_prefill(self) -> bool:
        return self.num_tokens - len(self.draft_ids) > 1 or self.start_pos < len(self.request.prompt_ids) - 1


@dataclass
class SchedulerOutput:
    chunks: list[ScheduledChunk] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)


class Scheduler:
    """Decides which tokens of which requests run in each step, and owns their pages.

    Args:
        allocator: the KV page allocator (owners are request ids).
        page_size: tokens per page.
        max_num_batched_tokens: token budget of one step (prefill chunks are cut to fit).
        max_num_seqs: most requests holding pages at once.
        mode: "mixed", "prefill_only" or "decode_only".
        prefix_caching: share cached prompt pages between requests (see the module's docstring).
        hash_lookahead: tokens after a page its cache key covers too (`config.hash_lookahead`).
    """

    def __init__(self, allocator: PageAllocator, page_size: int, max_num_batched_tokens: int, max_num_seqs: int = 256,
                 mode: Mode = "mixed", prefix_caching: bool = False, hash_lookahead: int = 0):
        assert mode in MODES and max_num_batched_tokens >= 1 and max_num_seqs >= 1
        self.allocator = allocator
        self.page_size = page_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.mode = mode
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0  # since start, for stats and tests
        self.prefix_cache = PrefixCache(allocator, page_size, prefix_caching, hash_lookahead)

    # requests in and out

    def add(self, request: Request) -> None:
        """Queue a request that has no KV yet."""
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def add_running(self, request: Request) -> None:
        """Admit a request whose pages the allocator already gives to ``request.request_id``."""
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def finish(self, request: Request, reason: str, keep_pages: bool = False) -> None:
        """Mark ``request`` finished and drop it; free its pages unless ``keep_pages``."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.prefix_cache.cache_computed(request)
        if not keep_pages:
            self.allocator.free(request.request_id)

    def find(self, request_id: str) -> Request | None:
        return next((r for r in (*self.running, *self.waiting) if r.request_id == request_id), None)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # one step

    def target_tokens(self, request: Request) -> int:
        """Tokens whose KV the request needs before it next samples (or ends, in prefill_only)."""
        if self.mode == "prefill_only":
            return len(request.prompt_ids) - 1
        return request.num_tokens

    def schedule(self) -> SchedulerOutput:
        """Choose this step's chunks, allocating pages (and preempting) as needed."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: set[str] = set()
        # decodes: one token each
        for req in list(self.running):
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            if self.target_tokens(req) - req.num_computed_tokens != 1:
                continue
            drafts = tuple(req.draft_ids[: budget - 1])
            if not self._reserve(req, 1 + len(drafts), scheduled, out):
                continue  # req itself was preempted
            out.chunks.append(self._chunk(req, 1, drafts))
            scheduled.add(req.request_id)
            budget -= 1 + len(drafts)
        # prefills: unfinished chunks first, then new requests in arrival order
        candidates = [r for r in self.running if r.request_id not in scheduled]
        candidates += list(self.waiting)
        for req in candidates:
            if budget == 0:
                break
            remaining = self.target_tokens(req) - req.num_computed_tokens
            if remaining <= 0 or (remaining == 1 and req.status is RequestStatus.RUNNING):
                continue
            is_new = req.status is RequestStatus.WAITING
            if is_new and len(self.running) >= self.max_num_seqs:
                break
            if is_new:
                hit = self.prefix_cache.share_prefix(req, self.target_tokens(req))
                remaining -= hit
            n = min(remaining, budget)
            if is_new:
                needed = self._pages_needed(req, n)
                if not self.allocator.can_allocate(needed):
                    if hit:  # give the shared pages back: they stay cached for its next try
                        self.allocator.free(req.request_id)
                        req.num_computed_tokens = 0
                    break  # new requests never evict others; they wait for pages to free up
                self.allocator.allocate(req.request_id, needed)
                self.prefix_cache.count_lookup(req, hit)
            elif not self._reserve(req, n, scheduled, out):
                continue  # an unfinished prefill may evict, else it would hold pages forever
            if is_new:
                self.waiting.remove(req)
                req.status = RequestStatus.RUNNING
                self.running.append(req)
            out.chunks.append(self._chunk(req, n))
            scheduled.add(req.request_id)
            budget -= n
        return out

    def _pages_needed(self, req: Request, num_new_tokens: int) -> int:
        have = len(self.allocator.page_ids(req.request_id))
        need = -(-(req.num_computed_tokens + num_new_tokens) // self.page_size)
        return max(0, need - have)

    def _reserve(self, req: Request, n: int, scheduled: set[str], out: SchedulerOutput) -> bool:
        """Allocate pages for ``n`` more tokens of ``req``, preempting others when out of pages.

        Returns False when ``req`` itself had to be preempted (nothing else could be evicted).
        """
        needed = self._pages_needed(req, n)
        while not self.allocator.can_allocate(needed):
            victim = self._pick_victim(exclude=scheduled)
            if victim is None or victim is req:
                self._preempt(req, out)
                return False
            self._preempt(victim, out)
        self.allocator.allocate(req.request_id, needed)
        return True

    def _pick_victim(self, exclude: set[str]) -> Request | None:
        return next((r for r in reversed(self.running)
                     if r.request_id not in exclude and not self.allocator.is_pinned(r.request_id)), None)

    def trim_pages(self, req: Request) -> int:
        """Return the pages past ``req``'s computed tokens and its next token (rejected drafts'
        pages) to the pool. Returns how many."""
        keep = -(-(req.num_computed_tokens + 1) // self.page_size)
        return self.allocator.truncate(req.request_id, keep)

    def _preempt(self, req: Request, out: SchedulerOutput) -> None:
        self.prefix_cache.cache_computed(req)  # its computed pages stay findable: its recompute may find them
        self.allocator.free(req.request_id)
        req.num_pages_cached = 0
        self.running.remove(req)
        req.num_computed_tokens = 0
        req.draft_ids = []
        req.num_preemptions += 1
        self.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self.waiting.appendleft(req)
        out.preempted_ids.append(req.request_id)

    def _chunk(self, req: Request, n: int, drafts: tuple[int, ...] = ()) -> ScheduledChunk:
        start = req.num_computed_tokens
        reaches_end = start + n == req.num_tokens
        return ScheduledChunk(
            request=req,
            start_pos=start,
            num_tokens=n + len(drafts),
            page_ids=tuple(self.allocator.page_ids(req.request_id)),
            sample=reaches_end and self.mode != "prefill_only",
            draft_ids=drafts,
        )
