"""The LLM engine: requests in, tokens out; `step()` is schedule, run, postprocess (settings: engine/config.py)."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

__all__ = ["EngineConfig", "EngineError", "LLMEngine"]


from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch
from disaggsdk.engine.compile_progress import CompileProgress, compile_failed_words
from disaggsdk.engine.compiled_step import compile_by_default
from disaggsdk.engine.config import MODE_OF_ROLE, EngineConfig, EngineError, check_prompt, hash_lookahead
from disaggsdk.engine.hooks import StepChunkInfo
from disaggsdk.engine.kv_port import KVPort
from disaggsdk.engine.layer_counter import new_layer_counter
from disaggsdk.engine.model_runner import ModelRunner, RunnerConfig
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.engine.sampling import new_generator
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.engine.scheduler import MODES, ScheduledChunk, Scheduler
from disaggsdk.engine.sequence import Request, RequestOutput
from disaggsdk.engine.speculative.speculator import check_speculative, mtp_drafts, new_speculator
from disaggsdk.engine.speculative.stats import SpecStats
from disaggsdk.engine.step_outputs import StepSettings, logits_rows, postprocess
from disaggsdk.engine.stopping import model_eos_ids
from disaggsdk.kv.page_allocator import PageAllocator
from disaggsdk.records.unit_counters import UnitCounters

log = logging.getLogger(__name__)


class LLMEngine:
    """A paged-KV engine for one model instance (tp ranks; this process is rank 0).

    Its KV pages, as a unit's messenger grants, pins, releases and migrates them, are one object it
    holds: ``kv``, a `KVPort` (engine/kv_port.py).

    Args:
        model: a tiny catalog name or a Hugging Face checkpoint directory.
        config: engine settings.
        kv_buffer: optional external memory for rank 0's KV pool (``kv_pool_bytes`` long).
        on_compile: told about compiling the step (only when it does; `CompileProgress`): "compiling"
            once the weights are loaded, right before the compile starts (in the background unless
            ``config.compile_in_background`` is False), then "compiled" or "failed" on the thread
            that steps the engine, at the step boundary where the engine takes the outcome (a
            failed compile leaves the engine eager). A launcher tells its user.
    Raises:
        EngineError: bad settings. ModelError: the model cannot be built.
    """

    def __init__(self, model: str, config: EngineConfig | None = None, kv_buffer: Any = None,
                 on_compile: Callable[[CompileProgress], None] | None = None):
        from disaggsdk.engine.modeling.base import check_tp
        from disaggsdk.models import resolve_model

        self.config = config = config or EngineConfig()
        if config.mode not in MODES:
            raise EngineError(f"unknown engine mode {config.mode!r}; use one of {MODES}")
        if config.max_num_batched_tokens < 1 or config.page_size < 1 or config.num_pages < 1:
            raise EngineError("max_num_batched_tokens, page_size and num_pages must all be >= 1")
        self.arch = resolve_model(model)
        check_tp(self.arch, config.tp)  # fail here, before any worker starts
        config.check_parallel(self.arch)
        check_speculative(self.arch, config)
        runner_config = RunnerConfig(
            model, config, compile=compile_by_default() if config.compile is None else config.compile,
            extra_kv_layers=self.arch.num_mtp_layers if mtp_drafts(config) else 0,
        )
        self._tp_group = None
        if config.tp > 1 or config.ep > 1:  # ep: the experts' exchange needs a group even at tp 1
            from disaggsdk.engine.tp_group import TPGroup

            self._tp_group = TPGroup(runner_config, self.arch.num_experts)
        # lock-step dp (engine.dp_lockstep): the heads' vote before each step; `stopping` is this
        # rank's wish to leave, `group_stopped` the group's decision
        self.lockstep = self._tp_group.lockstep if self._tp_group is not None else None
        self.stopping = False
        self.group_stopped = False
        self.group_idle = True  # the last vote found no rank with work
        try:
            tp = self._tp_group.tp if self._tp_group else TensorParallel()
            self.runner = ModelRunner(runner_config, tp, kv_buffer)
        except BaseException:
            self.close()
            raise
        # without the CUDA graphs' scratch page (engine.compiled_step.cuda_graphs), which no request may hold
        self.allocator = PageAllocator(config.num_pages - self.runner.num_scratch_pages)
        self.scheduler = Scheduler(
            self.allocator, config.page_size, config.max_num_batched_tokens, config.max_num_seqs, config.mode,
            prefix_caching=config.prefix_caching, hash_lookahead=hash_lookahead(config),
        )
        if config.tiers is not None and config.prefix_caching:
            from disaggsdk.engine.kv_tier_pages import PoolPages, open_tiers, page_identity

            identity = page_identity(config.tiers, self.runner.kv_cache, tp_rank=0, tp_size=config.tp)
            self.scheduler.prefix_cache.attach_tiers(open_tiers(config.tiers, identity), PoolPages(self.runner.kv_cache))
        self._speculator = new_speculator(config, self.runner, self.allocator, self._tp_group,
                                          lockstep=self.lockstep is not None)
        self.layer_counter = new_layer_counter(self.runner.device)  # LayerCounter on a CPU
        self._on_layer_done = self.layer_counter.on_layer_done if config.count_layers else None
        self._on_compile = on_compile
        if self.runner.can_compile:  # eager until the compiled step is ready (engine.background_compile)
            if on_compile is not None:
                on_compile(CompileProgress("compiling"))
            self.runner.start_compile(self._on_layer_done, config.compile_in_background)
            self.take_compiled_step()
        if self.runner.num_scratch_pages:  # a CUDA rank: decode steps as CUDA graphs, before it serves
            if on_compile is not None:
                on_compile(CompileProgress("compiling"))
            started_s = time.monotonic()
            self.runner.capture_decode_graphs(self._on_layer_done)
            if on_compile is not None:
                on_compile(CompileProgress("compiled", time.monotonic() - started_s))
        # called before each step with the chunks it runs (the messenger streams their pages)
        self.on_step: Callable[[list[StepChunkInfo]], None] | None = None
        self._seeds = itertools.count(config.seed * 1_000_003 + 1)
        self._eos_ids = model_eos_ids(model, self.arch.hf_config)
        self._step_settings = StepSettings(config.mode, config.return_hidden_states, self._eos_ids)
        # the page and migration interface the messenger moves KV through (it never reaches the allocator)
        self.kv = KVPort(cache=self.runner.kv_cache, allocator=self.allocator, scheduler=self.scheduler,
                         page_size=config.page_size, check_new=self._check_new, new_request=self._new_request,
                         check_prompt=self.check_prompt)

    # lifecycle

    def take_compiled_step(self) -> None:
        """Call between steps (`step` does; a unit's loop also does while idle, so that the outcome is
        told when it happens): once the background compile ended, run compiled from now on (drafts
        too), or, when it failed, stay eager and say so once."""
        if self.runner.compilation is None or self.runner.step is not None:
            return
        outcome = self.runner.take_compile_outcome()
        if outcome is None:
            return
        if outcome.stage == "compiled" and self._speculator is not None:
            self._speculator.use_compiled(self.runner.compilation.step)
        if self._on_compile is not None:
            self._on_compile(outcome)
        elif outcome.stage == "failed":
            log.warning("engine: %s", compile_failed_words(outcome.error))

    def wait_for_compiled_step(self, timeout_s: float | None = None) -> bool:
        """Block until a background compile ended (or ``timeout_s`` passed), then take its outcome;
        call it from the thread that steps the engine. Returns whether steps run compiled now."""
        if self.runner.compilation is not None and self.runner.compilation.wait(timeout_s):
            self.take_compiled_step()
        return self.runner.compilation is not None and self.runner.step is not None

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any, and a background compile after the graph it is
        on (engine.background_compile). Idempotent."""
        if "runner" in vars(self) and self.runner.compilation is not None:  # no runner: __init__ failed before it
            self.runner.compilation.stop()
        if self._tp_group is not None:
            self._tp_group.close()
            self._tp_group = None
        if "scheduler" in vars(self) and self.scheduler.prefix_cache.tiers is not None:
            self.scheduler.prefix_cache.tiers.close()  # flushes its queued writes: the disk tier outlives the unit

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # what a unit reads

    @property
    def spec_stats(self) -> SpecStats:
        """Speculative decoding's acceptance counters since start (all zero without speculation)."""
        return self._speculator.stats if self._speculator is not None else SpecStats()

    def counters(self, into: UnitCounters | None = None) -> UnitCounters:
        """A copy of ``into`` (zeros when None) with this engine's counters since start filled in:
        its scheduler's preemptions and prefix-cache lookups, speculative decoding's drafts, and
        expert parallelism's exchange and idle steps."""
        sched, spec = self.scheduler, self.spec_stats
        experts = self.runner.tp.experts
        tiers = sched.prefix_cache.tiers
        by_tier = tiers.counters() if tiers is not None else {}
        return msgspec.structs.replace(
            into if into is not None else UnitCounters(),
            num_preemptions=sched.num_preemptions,
            prefix_cache_queries=sched.prefix_cache.queries, prefix_cache_hits=sched.prefix_cache.hits,
            external_prefix_cache_hits=sched.prefix_cache.tier_hits,
            kv_tier_hit_pages={name: c.hits for name, c in by_tier.items()},
            kv_tier_read_bytes={name: c.bytes_read for name, c in by_tier.items()},
            kv_tier_written_bytes={name: c.bytes_written for name, c in by_tier.items()},
            kv_tier_evictions={name: c.evictions for name, c in by_tier.items()},
            kv_tier_corrupt_pages={name: c.corrupt for name, c in by_tier.items()},
            kv_tier_errors={name: c.errors for name, c in by_tier.items()},
            kv_tier_dropped_writes={name: c.dropped_writes for name, c in by_tier.items()},
            kv_tier_load_seconds=tiers.load_seconds if tiers is not None else 0.0,
            spec_num_drafts=spec.num_drafts, spec_num_draft_tokens=spec.num_draft_tokens,
            spec_num_accepted_tokens=spec.num_accepted_tokens,
            spec_accepted_per_position=list(spec.accepted_per_position),
            spec_drafts_per_position=list(spec.drafts_per_position),
            expert_all_to_all_bytes=experts.counters.payload_bytes if experts is not None else 0,
            expert_all_to_all_seconds=experts.counters.exchange_s if experts is not None else 0.0,
            dp_idle_steps=self.lockstep.num_idle_steps if self.lockstep is not None else 0)

    def held_experts(self) -> list[str]:
        """Under expert parallelism, what each rank of this engine holds of the routed experts, read
        from its parameters (`moe.held_experts_line`; rank 0 first); [] without ep."""
        from disaggsdk.engine.modeling.layers.moe import held_experts_line

        lines = [held_experts_line(self.runner.model)] + (self._tp_group.held_experts if self._tp_group else [])
        return [line for line in lines if line is not None]

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def must_step(self) -> bool:
        """Whether a loop driving this engine calls `step` now: when it has work, and always in a
        lock-step dp group until the group stops (the vote inside `step` needs every rank)."""
        return (self.lockstep is not None and not self.group_stopped) or self.has_unfinished()

    # requests

    def _check_new(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams, has_pages: bool = False
    ) -> None:
        if self.scheduler.find(request_id) is not None or (self.allocator.page_ids(request_id) and not has_pages):
            raise EngineError(f"request id {request_id!r} is already in use; use a fresh id")
        self.check_prompt(request_id, prompt_ids, params)

    def check_prompt(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        """Whether this engine can ever run the prompt (checked again when the request is added).

        Raises:
            EngineError: an empty prompt, a token outside the vocabulary, or prompt + max_tokens
                over the KV pool.
        """
        check_prompt(self.arch, self.config, request_id, prompt_ids, params.max_tokens)

    def _new_request(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams) -> Request:
        gen = None if params.greedy else new_generator(params.seed, next(self._seeds))
        grammar = None
        if params.structured is not None and self.config.mode != "prefill_only":  # prefill never samples
            from disaggsdk.engine.structured.grammar import GrammarState, ll_tokenizer

            grammar = GrammarState(params.structured, ll_tokenizer(self.runner.config.model))
        return Request(request_id, list(prompt_ids), params, generator=gen, grammar=grammar)

    def add_request(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> None:
        """Queue a request to be prefilled (in chunks) and decoded.

        Raises:
            EngineError: the id is in use, the prompt is empty or too long, or this is a
                decode_only engine (use `KVPort.add_prefilled_request`, the engine's ``kv``).
            StructuredOutputError: ``params.structured`` does not compile for this model.
        """
        params = params or SamplingParams()
        if self.config.mode == "decode_only":
            raise EngineError("a decode_only engine takes requests with their KV: use add_prefilled_request")
        self._check_new(request_id, prompt_ids, params)
        self.scheduler.add(self._new_request(request_id, prompt_ids, params))

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its pages. Returns False when it was unknown (a late abort)."""
        req = self.scheduler.find(request_id)
        if req is None:
            self.kv.drop_suspended(request_id)
            return self.allocator.free(request_id) > 0
        self.scheduler.finish(req, "abort")
        return True

    def switch_role(self, role: str) -> None:
        """Serve another unit role from now on ("prefill": prefill only, hidden states returned;
        "decode" / "mixed": decode, prefilling locally when asked), with the same weights, KV pool
        and compiled step. Only an idle engine switches; its prefix cache is kept (prompt pages are
        the same KV in either role). Layers are counted only when the engine was built to count them
        (`EngineConfig.count_layers`): a prefill unit's streamer reads that counter.

        Raises:
            EngineError: an unknown role, or requests still in the engine (running, waiting, suspended).
        """
        if role not in MODE_OF_ROLE:
            raise EngineError(f"unknown unit role {role!r}; use one of {sorted(MODE_OF_ROLE)}")
        if self.has_unfinished() or self.kv.suspended:
            raise EngineError(f"the engine still holds requests ({len(self.scheduler.running)} running, "
                              f"{len(self.scheduler.waiting)} waiting, {len(self.kv.suspended)} suspended): "
                              "it switches role only when idle")
        mode = MODE_OF_ROLE[role]
        self.config = dataclasses.replace(self.config, mode=mode, return_hidden_states=role == "prefill")
        self.scheduler.mode = mode
        self._step_settings = StepSettings(mode, self.config.return_hidden_states, self._eos_ids)
        if role != "prefill":
            self.on_step = None  # a prefill messenger's hook; nobody streams from this engine now

    # one step

    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample, and report every request touched.

        Returns:
            One `RequestOutput` per request that ran this step (finished ones included).
        """
        self.take_compiled_step()
        if self._speculator is not None:
            self._speculator.before_schedule(self.scheduler.running, self.scheduler.target_tokens)
        plan = self.scheduler.schedule()
        if self.lockstep is not None:
            if self.group_stopped:
                return []
            vote = self.lockstep.vote(bool(plan.chunks), self.stopping)
            self.group_stopped, self.group_idle = vote.stop, not vote.run
            if not vote.run:
                return []  # with no chunks scheduled: nothing was taken for them
            # with work or not, this rank runs the step: its MoE layers take part in every exchange
        elif not plan.chunks:
            return []
        if self.on_step is not None and plan.chunks:
            self.on_step([self._chunk_info(c) for c in plan.chunks])
        rows = [logits_rows(c, self._ends_prefill(c)) for c in plan.chunks]
        items = [BatchItem(c.token_ids, c.start_pos, c.page_ids, want_logits=r > 0, num_logits=max(r, 1))
                 for c, r in zip(plan.chunks, rows)]
        self.layer_counter.begin_step()
        batch = build_forward_batch(
            items, self.config.page_size, self.runner.device, on_layer_done=self._on_layer_done
        )
        if self._tp_group is not None:
            self._tp_group.broadcast(batch)
        hidden_all, hidden, logits = self.runner.run_keeping_hidden(batch)
        outputs = postprocess(plan.chunks, rows, hidden, logits, self.scheduler, self._step_settings,
                              self.spec_stats)
        for c in plan.chunks:  # finished ones offered theirs as they let go of them
            if not c.request.is_finished:
                self.scheduler.prefix_cache.cache_computed(c.request)
        if self._speculator is not None:
            self._speculator.after_step(batch, hidden_all, plan.chunks, self._on_layer_done)
        return outputs

    def _ends_prefill(self, chunk: ScheduledChunk) -> bool:
        return chunk.start_pos + chunk.num_tokens == self.scheduler.target_tokens(chunk.request) and chunk.is_prefill

    def _chunk_info(self, chunk: ScheduledChunk) -> StepChunkInfo:
        return StepChunkInfo(
            chunk.request.request_id, chunk.start_pos, chunk.num_tokens, chunk.page_ids, self._ends_prefill(chunk)
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion as one continuous batch.

        Args:
            prompts: token ids of each prompt.
            params: one for all, or one per prompt.
        Returns:
            The final output of each prompt, in order (with ``output_logprobs`` in ``new_logprobs``,
            and the prompt's logprobs when asked). In a lock-step dp group every rank calls it (with
            its own prompts, or none) and it returns when no rank has work left.
        """
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        base = f"gen-{next(self._seeds)}-"
        ids = [f"{base}{i}" for i in range(len(prompts))]
        for rid, prompt, p in zip(ids, prompts, params):
            self.add_request(rid, prompt, p)
        final: dict[str, RequestOutput] = {}
        reqs: dict[str, Request] = {}
        for rid in ids:  # each was just added: the scheduler holds it
            req = self.scheduler.find(rid)
            assert req is not None, rid
            reqs[rid] = req
        while any(rid not in final for rid in ids):
            outputs = self.step()
            if not outputs and (self.lockstep is None or self.group_idle):
                raise EngineError(
                    "no request can be scheduled (the KV pool is too small for the waiting prompts); "
                    "raise num_pages"
                )
            for out in outputs:
                if out.finished and out.request_id in reqs:
                    req = reqs[out.request_id]
                    out.new_logprobs = list(req.output_logprobs)
                    if req.params.prompt_logprobs is not None:
                        out.prompt_logprobs = list(req.prompt_logprobs)
                    final[out.request_id] = out
        self.step_until_group_idle()
        return [final[rid] for rid in ids]

    def step_until_group_idle(self) -> None:
        """In a lock-step dp group, once this rank's own work is done: step (empty batches) until a
        vote finds no work on any rank or the group stops; every rank leaves at that same vote. The
        other ranks' requests need this one in every MoE layer. Nothing outside a group."""
        if self.lockstep is None:
            return
        self.step()
        while not self.group_idle and not self.group_stopped:
            self.step()
