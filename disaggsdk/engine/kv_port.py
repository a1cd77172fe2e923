"""The engine's KV pages as the messenger moves them: one object the engine holds (`LLMEngine.kv`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from disaggsdk.engine.config import EngineError
from disaggsdk.engine.request_migration import MigrationError, RunningRequestState, restore_generator, snapshot
from disaggsdk.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.scheduler import Scheduler
    from disaggsdk.engine.sequence import Request
    from disaggsdk.kv.page_allocator import PageAllocator, PageGrant


class KVPort:
    """The page and migration interface of one engine.

    Args:
        cache: rank 0's KV cache (its ``buffer`` is the pool's memory, its ``fmt`` the pool's geometry).
        allocator: the engine's page allocator.
        scheduler: the engine's scheduler (admitted requests join it; its prefix cache shares pages).
        page_size: tokens per page.
        check_new: the engine's check of a new request (id not in use unless ``has_pages``, prompt fits).
        new_request: the engine's factory of a request (its sampler's generator, its grammar).
        check_prompt: the engine's check that a prompt of these tokens can ever run.
    """

    def __init__(self, *, cache: KVCache, allocator: PageAllocator, scheduler: Scheduler, page_size: int,
                 check_new: Callable[[str, Sequence[int], SamplingParams, bool], None],
                 new_request: Callable[[str, Sequence[int], SamplingParams], Request],
                 check_prompt: Callable[[str, Sequence[int], SamplingParams], None]):
        self.cache = cache
        self._allocator = allocator
        self._scheduler = scheduler
        self._page_size = page_size
        self._check_new = check_new
        self._new_request = new_request
        self._check_prompt = check_prompt
        # requests taken out of scheduling while their KV moves to another engine (`suspend`)
        self._suspended: dict[str, Request] = {}

    # what the messenger reads

    @property
    def num_free_pages(self) -> int:
        return self._allocator.num_free_pages

    @property
    def num_pages(self) -> int:
        """KV pages requests may hold: the pool's, less the CUDA graphs' scratch page when there is one."""
        return self._allocator.num_pages

    def page_ids(self, request_id: str) -> list[int]:
        """The pages ``request_id`` holds, in token order (a suspended request's: its computed KV)."""
        return self._allocator.page_ids(request_id)

    # grants: pages a remote writer fills

    def allocate_pages(self, request_id: str, num_tokens: int, pinned: bool = True) -> PageGrant:
        """Grant pages for ``num_tokens`` tokens to ``request_id`` (before its KV is written remotely).

        Raises:
            OutOfPagesError: not enough free pages.
        """
        num_pages = -(-num_tokens // self._page_size)
        return self._allocator.allocate(request_id, num_pages, pinned=pinned)

    def holds_grant(self, grant: PageGrant) -> bool:
        """Whether every page of ``grant`` (from `allocate_pages`) still belongs to it: not freed, not reused."""
        return self._allocator.is_current(grant)

    def pin_pages(self, request_id: str) -> None:
        """Keep ``request_id``'s pages from eviction while remote writes read or fill them (until
        `release`, or `add_prefilled_request`'s unpin).

        Raises:
            PageOwnershipError: the request holds no pages.
        """
        self._allocator.pin(request_id)

    def rename_pages(self, request_id: str, owner: str) -> int:
        """Hand every page of ``request_id`` (pin kept) to ``owner``, a name no request uses: a
        decode unit parks a retried attempt's pages there until no late write can land in them,
        then frees them with `release(owner)`. Returns how many pages moved (0: none held).

        Raises:
            PageOwnershipError: ``owner`` already holds pages.
        """
        return self._allocator.rename(request_id, owner)

    def release(self, request_id: str) -> int:
        """Free every page held under ``request_id``: those a finished prefill_only request kept for
        the transfer, or a decode unit's granted pages it will not use (an attempt that failed, or a
        quarantine owner's once no write of it can land). Returns their count (0: none held)."""
        return self._allocator.free(request_id)

    # the prefix cache

    def share_cached_prompt(self, request_id: str, prompt_ids: Sequence[int], count: bool = True) -> int:
        """Give ``request_id`` the cached pages holding the longest cached prefix of ``prompt_ids[:-1]``
        (a decode unit, before it grants pages for the rest). Returns how many pages (0 with the
        prefix cache off); ``count``: add the lookup to the prefix-cache counters."""
        return self._scheduler.prefix_cache.share_prompt(request_id, prompt_ids, count)

    def cached_prompt_pages(self, prompt_ids: Sequence[int]) -> int:
        """How many pages of ``prompt_ids[:-1]``'s longest cached prefix this engine's cache holds,
        without taking them (0 with the prefix cache off)."""
        return self._scheduler.prefix_cache.cached_pages(tuple(prompt_ids))

    def reset_prefix_cache(self) -> int:
        """Forget every cached page no request holds (vLLM's ``reset_prefix_cache``: between
        benchmark runs, after new weights); pages held by running requests keep their hashes. The
        unit's own KV tiers (host, disk) are emptied too; a shared store keeps its pages (other
        instances read it). Returns how many pages became free."""
        tiers = self._scheduler.prefix_cache.tiers
        if tiers is not None:
            tiers.forget_own_pages()
        return self._allocator.reset_cache()

    # admitting a request whose prompt KV another unit wrote

    def add_prefilled_request(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | None = None, num_cached_tokens: int = 0
    ) -> None:
        """Admit a request whose KV for ``prompt_ids[:-1]`` is already in its pages (`share_cached_prompt`'s,
        then `allocate_pages`'; their pin is lifted now: nothing writes to them any more). The last
        prompt token is run as its first decode token; its full pages join the prefix cache.
        ``num_cached_tokens``: prompt tokens no unit computed for it (its usage reports them).

        Raises:
            EngineError: no pages granted, too few for the prompt, or the id is already running.
        """
        params = params or SamplingParams()
        self._check_new(request_id, prompt_ids, params, True)
        held = len(self._allocator.page_ids(request_id)) * self._page_size
        if held < len(prompt_ids) - 1:
            raise EngineError(
                f"{request_id}: its pages hold {held} tokens but prompt[:-1] has {len(prompt_ids) - 1}; "
                f"grant pages with allocate_pages(request_id, len(prompt) - 1) first"
            )
        req = self._new_request(request_id, prompt_ids, params)
        req.num_computed_tokens = len(prompt_ids) - 1
        req.num_cached_tokens = num_cached_tokens
        self._allocator.unpin(request_id)
        self._scheduler.add_running(req)
        self._scheduler.prefix_cache.cache_computed(req)

    # moving a decoding request to another engine (engine.request_migration)

    def suspend(self, request_id: str) -> RunningRequestState:
        """Take a decoding request out of scheduling, its pages pinned and unchanged, and return its
        state: its KV can now be copied to another engine, which admits it with
        `add_migrated_request`. Then `release_suspended` (it moved) or `resume` (it did not).

        Raises:
            MigrationError: the request is not here, or not decoding (`request_migration.snapshot`).
        """
        req = self._scheduler.find(request_id)
        if req is None:
            raise MigrationError(f"request {request_id!r} is not running on this engine")
        state = snapshot(req)
        self._scheduler.running.remove(req)
        # pages past the computed ones (drafts' room) are not part of its KV: the receiver grants its own
        self._allocator.truncate(request_id, state.num_pages(self._page_size))
        self._allocator.pin(request_id)
        self._suspended[request_id] = req
        return state

    @property
    def suspended(self) -> list[str]:
        """Requests taken out of scheduling by `suspend` and not yet resumed or released."""
        return list(self._suspended)

    def resume(self, request_id: str) -> bool:
        """Put a suspended request back into scheduling, as it was. False: it is not suspended."""
        req = self._suspended.pop(request_id, None)
        if req is None:
            return False
        self._allocator.unpin(request_id)
        self._scheduler.add_running(req)
        return True

    def release_suspended(self, request_id: str) -> int:
        """Forget a suspended request (it continues on another engine) and free its pages; returns
        their count (0: it was not suspended)."""
        if self._suspended.pop(request_id, None) is None:
            return 0
        return self._allocator.free(request_id)

    def drop_suspended(self, request_id: str) -> bool:
        """Forget ``request_id`` if it is suspended (the engine's `abort` of a request it does not
        schedule); its pages stay for the caller to free. Returns whether it was."""
        return self._suspended.pop(request_id, None) is not None

    def add_migrated_request(self, state: RunningRequestState) -> None:
        """Continue a request another engine suspended, whose KV is already in the pages granted
        here under its id (`allocate_pages(request_id, state.num_computed_tokens)`; their pin is
        lifted now). A grammar is rebuilt and replayed over the output so far.

        Raises:
            MigrationError: too few pages, the id is in use here, or its sampler state or grammar
                does not load.
            EngineError: its tokens do not fit this engine (vocabulary, KV pool).
        """
        rid = state.request_id
        if self._scheduler.find(rid) is not None or rid in self._suspended:
            raise MigrationError(f"request id {rid!r} is already running here")
        held = len(self._allocator.page_ids(rid))
        if held < state.num_pages(self._page_size) or state.num_computed_tokens != state.num_tokens - 1:
            raise MigrationError(f"{rid}: {held} pages granted for {state.num_computed_tokens} computed tokens of "
                                 f"{state.num_tokens}; grant allocate_pages(request_id, num_computed_tokens) first")
        self._check_prompt(rid, state.prompt_ids + state.output_ids[:-1], state.params)
        req = self._new_request(rid, state.prompt_ids, state.params)
        req.output_ids = list(state.output_ids)
        req.generator = restore_generator(state) if req.generator is not None else None
        if req.grammar is not None:
            for token in state.output_ids:
                if not req.grammar.accept(token):
                    raise MigrationError(f"{rid}: its grammar refuses its own output at token {token} "
                                         f"({req.grammar.error})")
        req.num_computed_tokens = state.num_computed_tokens
        req.draft_ids = list(state.draft_ids)
        req.num_draft_tokens, req.num_accepted_tokens = state.num_draft_tokens, state.num_accepted_tokens
        req.num_cached_tokens, req.num_preemptions = state.num_cached_tokens, state.num_preemptions
        self._allocator.unpin(rid)
        self._scheduler.add_running(req)
        self._scheduler.prefix_cache.cache_computed(req)
