"""Discrete-event simulation of a deployment under a workload, disaggregated or colocated.

Events are arrivals (a workload's, or in a closed loop a client's once its last request finished), step
completions and KV transfers landing. The router sends each request to the decode (or, colocated, mixed)
instance with the fewest outstanding requests and, disaggregated, to the prefill instance with the fewest
outstanding prompt tokens; with conditional disaggregation (`$.transfer.max_local_prefill_tokens`) a short
prompt stays on its decode instance. The output has `disaggsdk bench`'s (vLLM's) field names, plus
per-instance utilisation, and SLO attainment where the config names SLOs.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import TYPE_CHECKING, Any

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.models import ModelArch, resolve_model
from disaggsdk.models.quantization import block_fp8_of
from disaggsdk.plan import make_plan
from disaggsdk.report.latency import SLO_NAMES, meets_slos, metric_stats, tokens_per_s_per_request
from disaggsdk.sim.cost_model import StepCostModel, transfer_cost_from_route
from disaggsdk.sim.engine_step import EngineStep
from disaggsdk.sim.front_end import FrontEnd
from disaggsdk.sim.hardware import HardwareProfile
from disaggsdk.sim.instance import RequestRecord, SimInstance, StepTokens
from disaggsdk.sim.kernels import CompleteKernelCosts, gemm_dtype

if TYPE_CHECKING:  # pyarrow and numpy stay out until a GPU simulation reads its tables
    from disaggsdk.sim.layered_kernels import LayeredKernels
from disaggsdk.sim.shared_cores import SharedCores
from disaggsdk.sim.step_batch import StepCost
from disaggsdk.sim.workload import ClosedLoop, SimRequest
from disaggsdk.spec import Spec


@attrs.frozen
class SimConfig:
    """Engine settings and assumptions of a simulation run, over what the simulated spec says (the
    requests each rank holds at once are its `$.engine.max_num_seqs`, as a launched deployment runs)."""

    profile: HardwareProfile
    weight_dtype: str = "bfloat16"  # what matrices run in: `default_weight_dtype` of the model ("fp8": block FP8)
    max_num_batched_tokens: int = 8192  # chunked-prefill token budget per step
    streaming: bool = True  # layer-wise KV streaming (False: the ablation, all after the forward)
    colocated: bool = False  # every instance of the spec becomes a mixed prefill+decode instance
    # MTP speculative decoding: fraction of draft tokens accepted (0 = off; DeepSeek-V3's
    # report gives 85-90% for its MTP module). Applies to decode in both layouts.
    mtp_acceptance: float = 0.0
    # CPU deployments: instances share this many cores (None: every instance owns its devices)
    # with idle units' polling and the server process every request and token passes through,
    # as processor sharing (`SharedCores`, `FrontEnd`)
    shared_cores: int | None = None
    # the benchmark client runs on those cores too (validation on this machine)
    client_shares_cores: bool = False
    percentiles: tuple[float, ...] = (50, 90, 99)
    # SLOs (ms, keys among ttft, tpot, e2el): the summary then has ``slo_attainment`` (the share of the
    # requests that met every one; an unfinished request met none) and ``request_goodput``, as bench's
    slos_ms: dict[str, float] = attrs.field(factory=dict)
    # GPU steps composed kernel by kernel (`engine_step.EngineStep`, where the profile names kernel tables):
    # the busiest device's routed-expert work over the mean (1.0: balanced, as EPLB keeps it and as the
    # tables time it), and SGLang's two-batch overlap of the expert exchange under compute
    expert_imbalance: float = attrs.field(default=1.0, validator=attrs.validators.ge(1.0))
    two_batch_overlap: bool = False


_KERNEL_COSTS: dict[HardwareProfile, LayeredKernels] = {}  # (profile, database) -> its layered kernel costs


def gpu_kernel_costs(profile: HardwareProfile) -> LayeredKernels:
    """The layered kernel costs of ``profile`` (`layered_kernels.kernel_costs_for`), made once a process:
    tune and compare run hundreds of simulations of one GPU, and the tables' lookups are memoized there."""
    from disaggsdk.sim.layered_kernels import kernel_costs_for

    if profile not in _KERNEL_COSTS:
        _KERNEL_COSTS[profile] = kernel_costs_for(profile)
    return _KERNEL_COSTS[profile]


def default_weight_dtype(model: str) -> str:
    """The dtype a model's matrices run in, from its checkpoint's format: "fp8" for a block-FP8 checkpoint
    (DeepSeek-R1, Qwen3-Coder-FP8: `models.quantization.block_fp8_of`), else "bfloat16".

    Raises:
        ModelError: the model cannot be resolved, or declares a quantization this project cannot load.
    """
    arch = resolve_model(model)
    return "fp8" if block_fp8_of(arch.hf_config, arch.name) is not None else "bfloat16"


class Simulation:
    """One run: build instances from ``spec``, feed ``requests``, drain, summarise."""

    def __init__(self, spec: Spec, config: SimConfig, arch: ModelArch | None = None):
        self.spec, self.config = spec, config
        self.arch = arch or resolve_model(spec.model)
        self.plan = make_plan(spec, self.arch)
        if self.plan.memory_problems:  # no simulated deployment holds more than its devices can
            raise SpecError(self.plan.memory_problems)
        unknown = sorted(set(config.slos_ms) - set(SLO_NAMES))
        if unknown:
            raise SpecError(f"unknown SLO {unknown}; use ttft, tpot or e2el (milliseconds)")
        self._events: list = []
        self._cores = SharedCores(config.shared_cores) if config.shared_cores else None
        self._front = FrontEnd(self._cores, self._reschedule_shared) if self._cores is not None else None
        self._steps_in_flight: dict[str, tuple[list, float]] = {}  # shared cores: name -> (chunks, start_s)
        self._seq = itertools.count()
        self._unsent: deque[SimRequest] = deque()  # closed loop: requests no client has sent yet
        self._sent: list[RequestRecord] = []  # closed loop: every request sent so far
        self._decode_of: dict[int, SimInstance] = {}
        self._prefill_of: dict[int, SimInstance] = {}
        self.prefill: list[SimInstance] = []
        self.decode: list[SimInstance] = []
        for inst in self.plan.instances:
            role = spec.prefill if inst.role == "prefill" else spec.decode
            mode = "mixed" if config.colocated else inst.role
            sim = self._make_instance(inst.name, mode, role.tp, role.dp, role.ep,
                                      self.plan.instance_memory(inst.name).kv_tokens)
            (self.prefill if inst.role == "prefill" and not config.colocated else self.decode).append(sim)
        self._instance = {i.name: i for i in self.prefill + self.decode}
        self._transfer = {}
        if not config.colocated:
            for p in self.prefill:
                for d in self.decode:
                    route = self.plan.route(p.name, d.name)
                    self._transfer[p.name, d.name] = transfer_cost_from_route(
                        route, config.profile, spec.kv.layout, spec.kv.page_size)

    @property
    def kernels(self) -> CompleteKernelCosts:
        """The kernel costs of the profile's GPU (its tables over its roofline; `layered_kernels`), shared
        by every simulation of that profile in this process."""
        return gpu_kernel_costs(self.config.profile)

    def kernel_sources(self) -> dict[str, str]:
        """Kernel kind -> where its times came from (tables, with how many calls each fit, or the roofline);
        for a profile without tables, every step priced by the cost model's blocks."""
        if self.config.profile.kernel_db is None:
            return {"step": f"block roofline of profile {self.config.profile.name} (sim.cost_model)"}
        return dict(self.kernels.sources())

    def _make_instance(self, name: str, mode: str, tp: int, dp: int, ep: int, kv_capacity_tokens: int) -> SimInstance:
        """A simulated instance whose KV holds the plan's ``kv_capacity_tokens`` (its ranks' memory); its
        experts spread over ``ep`` ranks as the spec's role says (the all-to-all term follows it). Its
        steps are priced kernel by kernel where the profile names measured kernel tables (a GPU), else
        by the cost model's blocks (a CPU, calibrated on the machine)."""
        p = self.config.profile
        cost: StepCost
        if p.kernel_db is None:
            cost = StepCostModel(self.arch, p, tp=tp, dp=dp, ep=ep, weight_dtype=self.config.weight_dtype,
                                 kv_dtype=self.spec.kv.dtype)
        else:
            cost = EngineStep(self.arch, self.kernels, tp=tp, dp=dp, ep=ep, weight_dtype=gemm_dtype(self.config.weight_dtype),
                              kv_dtype="fp8" if self.spec.kv.dtype == "fp8" else "bfloat16",
                              expert_imbalance=self.config.expert_imbalance, two_batch_overlap=self.config.two_batch_overlap,
                              launch_overhead_s_per_layer=p.kernel_overhead_us_per_layer * 1e-6,
                              step_overhead_s=p.step_overhead_ms * 1e-3,
                              overlap_scheduler=p.kernel_db.overlap_scheduler,
                              mtp_layers=self.arch.num_mtp_layers if self.config.mtp_acceptance > 0 else 0,
                              gpus_per_node=self.spec.hardware.gpus_per_node)
        extra_s = 0.0 if mode == "mixed" else self.config.profile.messenger_step_overhead_ms * 1e-3
        return SimInstance(name, mode, cost, self.config.max_num_batched_tokens,
                           self.spec.engine.max_num_seqs * dp, kv_capacity_tokens,
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
        if self._cores is None:
            self._push(now_s + dt, self._step_done, inst, chunks, now_s)
            return
        self._steps_in_flight[inst.name] = (chunks, now_s)
        self._cores.add_work(("step", inst.name), dt, now_s)
        self._reschedule_shared(now_s)

    def _step_done(self, now_s: float, inst: SimInstance, chunks: list, start_s: float) -> None:
        inst.busy = False
        tokens = inst.finish_step(chunks, now_s - start_s, now_s)
        if self._front is not None and tokens.num_tokens:
            self._deliver(tokens, now_s)
        elif self._front is None:
            self._clients_received(tokens.finished, now_s)
        self._kick(inst, now_s)
        if self._cores is not None and not inst.busy:
            self._reschedule_shared(now_s)  # it went idle: the background changed

    # CPU deployments: steps, the front end's work and idle units' polling share the cores
    # (`SharedCores`); every change re-times every job in flight.
    def _reschedule_shared(self, now_s: float) -> None:
        assert self._cores is not None, "only a CPU deployment shares its cores"
        profile = self.config.profile
        idle_cores = sum(profile.idle_messenger_unit_cores if i.mode != "mixed" else profile.idle_unit_cores
                         for i in self._instance.values() if not i.busy)
        self._cores.set_background(idle_cores, now_s)
        for time_s, key, version in self._cores.completions(now_s):
            self._push(time_s, self._shared_job_done, key, version)

    def _shared_job_done(self, now_s: float, key: tuple[str, str], version: int) -> None:
        assert self._cores is not None, "only a CPU deployment shares its cores"
        if not self._cores.is_current(key, version):
            return  # a rescheduled completion: the core share changed since
        self._cores.finish(key, now_s)
        kind, name = key
        if kind == "step":
            chunks, start_s = self._steps_in_flight.pop(name)
            self._step_done(now_s, self._instance[name], chunks, start_s)
        else:
            assert self._front is not None, "front-end jobs run where a front end is simulated"
            self._front.job_done(name, now_s)

    # CPU deployments: requests and tokens also pass through the server and the client (`FrontEnd`);
    # a request's first and last token count when the client has them
    def _deliver(self, tokens: StepTokens, now_s: float) -> None:
        p = self.config.profile
        hops = [("server", tokens.num_tokens * p.frontend_cpu_ms_per_token * 1e-3)]
        if self.config.client_shares_cores:
            hops.append(("client", tokens.num_tokens * p.client_cpu_ms_per_token * 1e-3))

        def delivered(at_s: float) -> None:
            for record in tokens.first:
                record.first_token_s = at_s
            for record in tokens.finished:
                record.finish_s = at_s
            self._clients_received(tokens.finished, at_s)
        assert self._front is not None, "tokens pass a front end only where one is simulated"
        self._front.submit(hops, delivered, now_s)

    def _receive(self, now_s: float, record: RequestRecord) -> None:
        p = self.config.profile
        hops = [("server", p.frontend_cpu_ms_per_request * 1e-3)]
        if self.config.client_shares_cores:
            hops.insert(0, ("client", p.client_cpu_ms_per_request * 1e-3))
        assert self._front is not None, "requests pass a front end only where one is simulated"
        self._front.submit(hops, lambda at_s: self._after_front_end(at_s, record), now_s)

    # closed loop: a client whose request finished sends its next one
    def _clients_received(self, finished: list[RequestRecord], now_s: float) -> None:
        for record in finished:
            if not self._unsent:
                return
            request = attrs.evolve(self._unsent.popleft(), arrival_s=now_s, client_id=record.request.client_id)
            self._send(RequestRecord(request), now_s)

    def _send(self, record: RequestRecord, now_s: float) -> None:
        self._sent.append(record)
        self._push(now_s, self._arrive, record)

    def _arrive(self, now_s: float, record: RequestRecord) -> None:
        if self._front is not None:
            self._receive(now_s, record)
        else:
            self._after_front_end(now_s, record)

    def _after_front_end(self, now_s: float, record: RequestRecord) -> None:
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
        # conditional disaggregation (`$.transfer.max_local_prefill_tokens`): a short prompt is computed by its
        # decode instance, with no handoff (no prefix cache is simulated: every prompt token is missing)
        if record.request.input_len <= self.spec.transfer.max_local_prefill_tokens:
            decode.admit_prefill(record, local=True)
            self._kick(decode, now_s)
            return
        prefill = min(self.prefill, key=lambda i: i.outstanding_prefill_tokens)
        self._decode_of[record.request.request_id] = decode
        decode.num_incoming += 1
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
        decode.num_incoming -= 1
        decode.admit_decode(record)
        self._kick(decode, now_s)

    @property
    def requests_sent(self) -> list[RequestRecord]:
        """Every request sent so far, in the order sent, with the times it saw (after `run`: all of them)."""
        return list(self._sent)

    # run
    def run(self, workload: list[SimRequest] | ClosedLoop) -> dict[str, Any]:
        """Simulate until every request finished; return the bench-compatible summary.

        Args:
            workload: requests arriving at their ``arrival_s`` (open loop), or a `ClosedLoop` of clients that
                send at time 0 and then each time their previous request finished; its summary also has
                ``max_concurrency`` (the clients, as `disaggsdk bench` reports its ``--max-concurrency``).
        Raises:
            WorkloadError: a closed loop that cannot be drawn (`ClosedLoop.requests`).
        """
        if isinstance(workload, ClosedLoop):
            requests = workload.requests()
            self._unsent.extend(requests[workload.concurrency:])
            for request in requests[:workload.concurrency]:
                self._send(RequestRecord(request), 0.0)
        else:
            for request in workload:
                self._send(RequestRecord(request), request.arrival_s)
        while self._events:
            time_s, _, handler, args = heapq.heappop(self._events)
            handler(time_s, *args)
        assert not self._unsent, "every client's request finished, so every request was sent"
        summary = self._summary(self._sent)
        if isinstance(workload, ClosedLoop):
            summary["max_concurrency"] = workload.concurrency
        return summary

    def _summary(self, records: list[RequestRecord]) -> dict[str, Any]:
        pct = self.config.percentiles
        done = [r for r in records if r.finish_s >= 0]
        duration = max((r.finish_s for r in done), default=0.0) or 1e-9
        ttft = [(r.first_token_s - r.request.arrival_s) * 1e3 for r in done]
        e2el = [(r.finish_s - r.request.arrival_s) * 1e3 for r in done]
        tpot = [(r.finish_s - r.first_token_s) * 1e3 / (r.request.output_len - 1)
                for r in done if r.request.output_len > 1]
        itl: list[float] = []
        weights: list[float] = []
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
        if self.config.slos_ms:
            good = sum(self._met_slos(r, self.config.slos_ms) for r in done)
            result["request_goodput"] = good / duration
            result["slo_attainment"] = good / len(records) if records else 0.0
            for name, limit in self.config.slos_ms.items():  # as bench's: the share of requests that missed each
                result[f"slo_missed_{name}"] = (len(records) - sum(self._met_slos(r, {name: limit}) for r in done)) \
                    / len(records) if records else 0.0
        result["utilisation"] = {i.name: i.busy_s / duration for i in self.prefill + self.decode}
        result["mode"] = "colocated" if self.config.colocated else "disaggregated"
        return result


    @staticmethod
    def _met_slos(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
        """Whether a finished request met every SLO of ``slos_ms``, judged as a measured one is
        (`report.latency.meets_slos`: TPOT over the tokens after the first)."""
        r = record.request
        tpot_ms = (record.finish_s - record.first_token_s) * 1e3 / (r.output_len - 1) if r.output_len > 1 else None
        return meets_slos((record.first_token_s - r.arrival_s) * 1e3, tpot_ms, (record.finish_s - r.arrival_s) * 1e3,
                          slos_ms)
