"""Discrete-event simulation of a deployment under a workload, disaggregated or colocated.

Events are arrivals, step completions and KV transfers landing. The router sends each request to
the decode (or, colocated, mixed) instance with the fewest outstanding requests and, when
disaggregated, to the prefill instance with the fewest outstanding prompt tokens. The output has
the field names of `disaggsdk bench` (vLLM's), plus per-instance utilisation.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any

import attrs

from disaggsdk.models import ModelArch, resolve_model
from disaggsdk.plan import make_plan
from disaggsdk.report.latency import metric_stats, tokens_per_s_per_request
from disaggsdk.sim.cost_model import StepCostModel, transfer_cost_from_route
from disaggsdk.sim.hardware import HardwareProfile
from disaggsdk.sim.instance import RequestRecord, SimInstance
from disaggsdk.sim.workload import SimRequest
from disaggsdk.spec import Spec


@attrs.frozen
class SimConfig:
    """Engine settings and assumptions of a simulation run."""

    profile: HardwareProfile
    weight_dtype: str = "bfloat16"  # "fp8" for DeepSeek-R1's native checkpoint
    max_num_batched_tokens: int = 8192  # chunked-prefill token budget per step
    max_num_seqs: int = 256
    streaming: bool = True  # layer-wise KV streaming (False: the ablation, all after the forward)
    colocated: bool = False  # every instance of the spec becomes a mixed prefill+decode instance
    # MTP speculative decoding: fraction of draft tokens accepted (0 = off; DeepSeek-V3's
    # report gives 85-90% for its MTP module). Applies to decode in both layouts.
    mtp_acceptance: float = 0.0
    # CPU deployments: instances share this many cores (None: every instance owns its devices).
    # Steps in flight share them fairly: with k running, each advances at min(1, cores / k).
    shared_cores: int | None = None
    percentiles: tuple[float, ...] = (50, 90, 99)


def default_weight_dtype(model: str) -> str:
    """DeepSeek-R1 ships FP8 weights; the others are served in bf16."""
    return "fp8" if model.startswith("deepseek-r1") and not model.endswith("-tiny") else "bfloat16"


class Simulation:
    """One run: build instances from ``spec``, feed ``requests``, drain, summarise."""

    def __init__(self, spec: Spec, config: SimConfig, arch: ModelArch | None = None):
        self.spec, self.config = spec, config
        self.arch = arch or resolve_model(spec.model)
        self.plan = make_plan(spec, self.arch)
        self._events: list = []
        self._num_busy = 0  # instances with a step in flight
        # shared cores: name -> [solo seconds of work left, start_s, chunks, version]
        self._sharing: dict[str, list] = {}
        self._shared_since_s = 0.0
        self._seq = itertools.count()
        self._decode_of: dict[int, SimInstance] = {}
        self._prefill_of: dict[int, SimInstance] = {}
        self.prefill: list[SimInstance] = []
        self.decode: list[SimInstance] = []
        for inst in self.plan.instances:
            role = spec.prefill if inst.role == "prefill" else spec.decode
            mode = "mixed" if config.colocated else inst.role
            sim = self._make_instance(inst.name, mode, role.tp, role.dp)
            (self.prefill if inst.role == "prefill" and not config.colocated else self.decode).append(sim)
        self._instance = {i.name: i for i in self.prefill + self.decode}
        self._transfer = {}
        if not config.colocated:
            for p in self.prefill:
                for d in self.decode:
                    route = self.plan.route(p.name, d.name)
                    self._transfer[p.name, d.name] = transfer_cost_from_route(
                        route, config.profile, spec.kv.layout, spec.kv.page_size)

    def _make_instance(self, name: str, mode: str, tp: int, dp: int) -> SimInstance:
        cost = StepCostModel(self.arch, self.config.profile, tp=tp, dp=dp,
                             weight_dtype=self.config.weight_dtype, kv_dtype=self.spec.kv.dtype)
        extra_s = 0.0 if mode == "mixed" else self.config.profile.messenger_step_overhead_ms * 1e-3
        return SimInstance(name, mode, cost, self.config.max_num_batched_tokens,
                           self.config.max_num_seqs * dp, cost.kv_capacity_tokens(),
                           on_prefill_done=self._prefill_done, mtp_acceptance=self.config.mtp_acceptance,
                           extra_step_s=extra_s)

    # events
    def _push(self, time_s: float, handler, *args) -> None:
        heapq.heappush(self._events, (time_s, next(self._seq), handler, args))

    def _kick(self, inst: SimInstance, now_s: float) -> None:
        if inst.busy or not inst.has_work():
            return
        dt, chunks = inst.plan_step(now_s)
        if dt <= 0:
            return
        inst.busy = True
        self._num_busy += 1
        if not self.config.shared_cores:
            self._push(now_s + dt, self._step_done, inst, chunks, now_s, 0)
            return
        self._share_cores(now_s)
        self._sharing[inst.name] = [dt, now_s, chunks, 0]
        self._reschedule_shared(now_s)

    def _step_done(self, now_s: float, inst: SimInstance, chunks: list, start_s: float, version: int) -> None:
        if self.config.shared_cores:
            state = self._sharing.get(inst.name)
            if state is None or state[3] != version:
                return  # a rescheduled completion: the core share changed since
            self._share_cores(now_s)
            del self._sharing[inst.name]
        inst.busy = False
        self._num_busy -= 1
        inst.finish_step(chunks, now_s - start_s, now_s)
        if self.config.shared_cores:
            self._reschedule_shared(now_s)
        self._kick(inst, now_s)

    # CPU deployments: steps in flight share the cores like threads under Linux's fair scheduler
    # (processor sharing): with k steps running on c cores each advances at min(1, c / k) of its
    # solo speed, and the rate changes whenever a step starts or ends -- also for steps already
    # running, which a rate fixed at a step's start would miss.
    def _core_share(self) -> float:
        return min(1.0, self.config.shared_cores / max(1, len(self._sharing)))

    def _share_cores(self, now_s: float) -> None:
        """Charge the work done since the last change at the share that held meanwhile."""
        rate = self._core_share()
        for state in self._sharing.values():
            state[0] -= (now_s - self._shared_since_s) * rate
        self._shared_since_s = now_s

    def _reschedule_shared(self, now_s: float) -> None:
        rate = self._core_share()
        for name, state in self._sharing.items():
            state[3] += 1
            inst = self._instance[name]
            self._push(now_s + max(0.0, state[0]) / rate, self._step_done, inst, state[2], state[1], state[3])

    def _arrive(self, now_s: float, record: RequestRecord) -> None:
        delay_s = self.config.profile.request_overhead_ms * 1e-3
        if delay_s > 0:
            self._push(now_s + delay_s, self._route, record)
        else:
            self._route(now_s, record)

    def _route(self, now_s: float, record: RequestRecord) -> None:
        decode = min(self.decode, key=lambda i: i.outstanding)
        if self.config.colocated:
            decode.admit_prefill(record)
            self._kick(decode, now_s)
            return
        prefill = min(self.prefill, key=lambda i: i.outstanding_prefill_tokens)
        self._decode_of[record.request.request_id] = decode
        self._prefill_of[record.request.request_id] = prefill
        prefill.admit_prefill(record)
        self._kick(prefill, now_s)

    def _prefill_done(self, record: RequestRecord, now_s: float) -> None:
        rid = record.request.request_id
        decode, prefill = self._decode_of.pop(rid), self._prefill_of.pop(rid)
        cost = self._transfer[prefill.name, decode.name]
        tokens = record.request.input_len - 1
        exposed = cost.exposed_s(tokens, self.config.streaming)
        if self.config.streaming:  # writes cannot run ahead of the layers that produce them
            exposed = max(exposed, cost.total_s(tokens) - (now_s - record.prefill_start_s))
        handoff_s = self.config.profile.handoff_overhead_ms * 1e-3
        self._push(now_s + exposed + handoff_s, self._transfer_done, decode, record)

    def _transfer_done(self, now_s: float, decode: SimInstance, record: RequestRecord) -> None:
        decode.admit_decode(record)
        self._kick(decode, now_s)

    # run
    def run(self, requests: list[SimRequest]) -> dict[str, Any]:
        """Simulate until every request finished; return the bench-compatible summary."""
        records = [RequestRecord(r) for r in requests]
        for rec in records:
            self._push(rec.request.arrival_s, self._arrive, rec)
        while self._events:
            time_s, _, handler, args = heapq.heappop(self._events)
            handler(time_s, *args)
        return self._summary(records)

    def _summary(self, records: list[RequestRecord]) -> dict[str, Any]:
        pct = self.config.percentiles
        done = [r for r in records if r.finish_s >= 0]
        duration = max((r.finish_s for r in done), default=0.0) or 1e-9
        ttft = [(r.first_token_s - r.request.arrival_s) * 1e3 for r in done]
        e2el = [(r.finish_s - r.request.arrival_s) * 1e3 for r in done]
        tpot = [(r.finish_s - r.first_token_s) * 1e3 / (r.request.output_len - 1)
                for r in done if r.request.output_len > 1]
        itl, weights = [], []
        for inst in self.prefill + self.decode:
            itl.extend(inst.itl_ms)
            weights.extend(inst.itl_weight)
        out_tokens = sum(r.request.output_len for r in done)
        in_tokens = sum(r.request.input_len for r in done)
        result: dict[str, Any] = {
            "duration": duration, "completed": len(done), "failed": len(records) - len(done),
            "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
            "request_throughput": len(done) / duration, "output_throughput": out_tokens / duration,
            "total_token_throughput": (in_tokens + out_tokens) / duration,
        }
        result |= metric_stats("ttft", ttft, pct)
        result |= metric_stats("tpot", tpot, pct)
        result |= metric_stats("itl", itl, pct, weights)
        result |= metric_stats("e2el", e2el, pct)
        result["mean_tokens_per_s_per_request"] = tokens_per_s_per_request(tpot)
        result["utilisation"] = {i.name: i.busy_s / duration for i in self.prefill + self.decode}
        result["mode"] = "colocated" if self.config.colocated else "disaggregated"
        return result


def simulate(spec: Spec, requests: list[SimRequest], config: SimConfig) -> dict[str, Any]:
    """Simulate ``spec`` serving ``requests``; see `Simulation`."""
    return Simulation(spec, config).run(requests)
