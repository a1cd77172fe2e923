"""One simulated engine instance: continuous batching with chunked prefill, step by step.

Modes mirror the real engine's: ``mixed`` (colocated: decode tokens first, then prefill chunks
fill the token budget), ``prefill`` (prefill chunks only; finished prompts leave for a decode
instance) and ``decode`` (admitted requests whose KV arrived; no prefill ever).

Running decodes are kept as aggregates (count, sum of contexts) plus a heap of finish steps, so a
step costs O(log n) whatever the batch size: 64 nodes for 10 minutes stay within a minute.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from disaggsdk.sim.step_batch import StepBatch, StepCost
from disaggsdk.sim.workload import SimRequest


@dataclass
class RequestRecord:
    """Times one simulated request saw (seconds)."""

    request: SimRequest
    first_token_s: float = -1.0
    finish_s: float = -1.0
    prefill_start_s: float = -1.0
    prefill_done_s: float = -1.0


@dataclass
class StepTokens:
    """What one step gave to clients: how many tokens, whose first token, whose last."""

    num_tokens: int = 0
    first: list[RequestRecord] = field(default_factory=list)
    finished: list[RequestRecord] = field(default_factory=list)


@dataclass
class _Prefill:
    record: RequestRecord
    done_tokens: int = 0  # tokens already prefilled
    target_tokens: int = 0  # tokens to prefill (mixed or local: whole prompt; prefill mode: prompt[:-1])
    local: bool = False  # a decode instance prefills it itself (conditional disaggregation), then decodes it


@dataclass
class SimInstance:
    """A simulated instance; the simulator calls `admit_prefill`, `admit_decode` and `step`."""

    name: str
    mode: str  # "mixed" | "prefill" | "decode"
    cost: StepCost  # `cost_model.StepCostModel` (CPU) or `engine_step.EngineStep` (GPU kernels)
    max_num_batched_tokens: int
    max_num_seqs: int  # the instance's, all dp ranks together
    kv_capacity_tokens: int = 1 << 62
    # speculative decoding with the MTP layer: each decode step verifies one draft token per
    # sequence (two tokens of compute) and emits 1 + mtp_acceptance tokens on average
    mtp_acceptance: float = 0.0
    on_prefill_done: Callable[[RequestRecord, float], None] | None = None
    extra_step_s: float = 0.0  # added to every step (a disaggregated unit's messenger work)
    # decode mode: requests routed here whose prefill or KV transfer is still under way (the real
    # router counts them as in flight from the moment it picks this instance)
    num_incoming: int = 0
    busy_s: float = 0.0
    itl_ms: array = field(default_factory=lambda: array("d"))  # one entry per step
    itl_weight: array = field(default_factory=lambda: array("d"))  # requests that got a token then
    finished: list[RequestRecord] = field(default_factory=list)
    # state
    _prefills: deque = field(default_factory=deque)
    _admit_queue: deque = field(default_factory=deque)  # (record, context) waiting for KV room
    _joining: list = field(default_factory=list)  # (record, context) joining at the next step
    _running: list = field(default_factory=list)  # heap of (finish_step, id, record, context0, join_step)
    _num_running: int = 0
    _context_sum: float = 0.0
    _reserved_tokens: int = 0
    _step: int = 0
    busy: bool = False

    # admission
    def admit_prefill(self, record: RequestRecord, local: bool = False) -> None:
        """Queue a request's prompt for prefill (mixed and prefill modes; ``local``: a decode instance
        computes the prompt itself and decodes it, as conditional disaggregation sends a short one)."""
        n = record.request.input_len
        whole = self.mode == "mixed" or local
        self._prefills.append(_Prefill(record, 0, n if whole else n - 1, local))

    def admit_decode(self, record: RequestRecord) -> None:
        """A request whose KV arrived: it decodes from its last prompt token (decode mode)."""
        self._admit_queue.append((record, record.request.input_len))

    @property
    def outstanding(self) -> int:
        """Requests here not finished (or on their way here): the router's measure of work."""
        return (self.num_incoming + len(self._prefills) + len(self._admit_queue) + len(self._joining)
                + self._num_running)

    @property
    def outstanding_prefill_tokens(self) -> int:
        """Prompt tokens queued here and not yet computed: the router's measure of prefill work."""
        return sum(p.target_tokens - p.done_tokens for p in self._prefills)

    def has_work(self) -> bool:
        return bool(self._prefills or self._admit_queue or self._joining or self._num_running)

    # one step
    def plan_step(self, now_s: float) -> tuple[float, list]:
        """Choose the work of a step starting at ``now_s``; return (duration_s, prefill chunks)."""
        while self._admit_queue and self._num_running + len(self._joining) < self.max_num_seqs:
            record, context = self._admit_queue[0]
            need = record.request.input_len + record.request.output_len
            if self._reserved_tokens + need > self.kv_capacity_tokens and (self._num_running or self._joining):
                break
            self._admit_queue.popleft()
            self._reserved_tokens += need
            self._joining.append((record, context))
        decode_seqs = self._num_running + len(self._joining)
        decode_tokens = decode_seqs * (2 if self.mtp_acceptance > 0 else 1)
        context_sum = self._context_sum + sum(c for _, c in self._joining)
        budget = self.max_num_batched_tokens - decode_tokens
        chunks: list[tuple[_Prefill, int]] = []
        for p in self._prefills:
            if budget <= 0:
                break
            n = min(budget, p.target_tokens - p.done_tokens)
            if p.done_tokens == 0:
                p.record.prefill_start_s = now_s
            chunks.append((p, n))
            budget -= n
        batch = StepBatch(decode_seqs, context_sum, 2 if self.mtp_acceptance > 0 else 1,
                          tuple((n, p.done_tokens) for p, n in chunks))
        dt = self.cost.batch_time_s(batch) + self.extra_step_s
        return dt, chunks

    def finish_step(self, chunks: list, dt: float, end_s: float) -> StepTokens:
        """Apply a step that ended at ``end_s``: tokens out, prefills advanced, finishes recorded.

        Returns:
            the tokens the step gave to clients (first tokens included).
        """
        self.busy_s += dt
        finished_before = len(self.finished)
        out = StepTokens(round(self._num_running * self._tokens_per_step) + len(self._joining))
        if self._num_running:
            self.itl_ms.append(dt * 1e3)
            self.itl_weight.append(self._num_running)
        self._context_sum += self._num_running * self._tokens_per_step  # every context grew
        self._step += 1
        while self._running and self._running[0][0] <= self._step:
            _, _, record, context0, join_step = heapq.heappop(self._running)
            record.finish_s = end_s
            self._num_running -= 1
            self._context_sum -= context0 + (self._step - join_step) * self._tokens_per_step
            self._reserved_tokens -= record.request.input_len + record.request.output_len
            self.finished.append(record)
        for record, context in self._joining:  # their first token came out of this step
            record.first_token_s = end_s
            out.first.append(record)
            self._join(record, context + 1, record.request.output_len - 1)
        self._joining.clear()
        for p, n in chunks:
            p.done_tokens += n
        while self._prefills and self._prefills[0].done_tokens >= self._prefills[0].target_tokens:
            p = self._prefills.popleft()
            p.record.prefill_done_s = end_s
            if self.mode == "mixed" or p.local:
                p.record.first_token_s = end_s
                out.num_tokens += 1
                out.first.append(p.record)
                self._reserved_tokens += p.record.request.input_len + p.record.request.output_len
                self._join(p.record, p.record.request.input_len + 1, p.record.request.output_len - 1)
            elif self.on_prefill_done is not None:
                self.on_prefill_done(p.record, end_s)
        out.finished = self.finished[finished_before:]
        return out

    @property
    def _tokens_per_step(self) -> float:
        return 1.0 + self.mtp_acceptance

    def _join(self, record: RequestRecord, context: int, remaining_tokens: int) -> None:
        if remaining_tokens <= 0:
            record.finish_s = record.first_token_s
            self._reserved_tokens -= record.request.input_len + record.request.output_len
            self.finished.append(record)
            return
        steps = math.ceil(remaining_tokens / self._tokens_per_step)
        heapq.heappush(self._running, (self._step + steps, record.request.request_id,
                                       record, context, self._step))
        self._num_running += 1
        self._context_sum += context
