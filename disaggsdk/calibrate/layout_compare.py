"""Should I disaggregate? Goodput of each layout on the user's trace, measured here and simulated at scale.

On this machine every layout that fits is launched, swept for its goodput rate with the user's
trace (`bench.goodput_sweep`, the same procedure as `disaggsdk bench --request-rate search`) and torn
down: colocated (every instance mixed), disaggregated at each P:D whose units fit the cores, and
conditional disaggregation (the P1:D1 layout whose decode unit computes prompts of at most
``local_prefill_tokens`` itself, `$.transfer.max_local_prefill_tokens`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Literal, Protocol

import attrs

from disaggsdk.bench.goodput_sweep import RateSweep, first_run_seed, limit_text, run_sweep
from disaggsdk.bench.serve_bench import BenchResult, LoadShape, arrival_gaps_s
from disaggsdk.bench.trace_dataset import TraceDraws
from disaggsdk.calibrate.validate import bench_cli_in_subprocess
from disaggsdk.errors import DisaggError
from disaggsdk.records.goodput_records import Comparison, GoodputSweep, LayoutGoodput, TargetGoodput
from disaggsdk.sim.hardware import HardwareProfile, load_profile
from disaggsdk.sim.machine_config import machine_sim_config
from disaggsdk.sim.runner import default_profile_name
from disaggsdk.sim.simulator import SimConfig, Simulation, default_weight_dtype
from disaggsdk.sim.workload import SimRequest
from disaggsdk.spec import Spec

if TYPE_CHECKING:
    from disaggsdk.bench.dataset import BenchRequest
    from disaggsdk.calibrate.speed_monitor import SpeedMonitor
    from disaggsdk.report.ttft_phases import PhaseSummary

DEFAULT_LOCAL_PREFILL_TOKENS = 512  # conditional: prompts this short are computed on decode
TARGET_REQUESTS = 1000  # requests per simulated run at the target's scale (its rates are far higher)
PERCENTILES = (50, 90, 99)
# (seed, how many) -> the trace's requests: the same draw for a measured run and its simulated twin
RequestsFor = Callable[[int, int], "list[BenchRequest]"]


class LaunchedLayout(Protocol):
    """What a comparison reads of a launched layout (`disaggsdk.face.deployment.Deployment` is one)."""

    @property
    def url(self) -> str:
        """The OpenAI-compatible endpoint's base URL."""
        ...

    def ttft_phases(self, since_s: float = 0.0) -> PhaseSummary | None:
        """Where the TTFT of requests received since ``since_s`` went (`report.ttft_phases`)."""
        ...

    def wait_until_compiled(self, timeout_s: float = ...) -> dict[str, str | None]:
        """Block until no unit still compiles its step (`Deployment.wait_until_compiled`)."""
        ...


class LayoutLauncher(Protocol):
    """Starts a layout: ``launch(spec, colocated=..., port=0)`` as `disaggsdk.face.deployment.launch`, a
    context manager that stops every process it started."""

    def __call__(self, spec: Spec, *, colocated: bool, port: int) -> AbstractContextManager[LaunchedLayout]: ...


class CompareError(DisaggError):
    """A comparison that cannot run as asked (no layout fits, a spec without a CPU twin)."""


@attrs.frozen
class Layout:
    """One way to deploy: a name a person reads, the spec that runs it, and whether every instance
    of that spec runs mixed (the colocated twin: the same processes, each doing prefill and decode)."""

    name: str
    spec: Spec
    colocated: bool = False

    @property
    def kind(self) -> Literal["colocated", "disaggregated", "conditional"]:
        """What family the layout belongs to."""
        if self.colocated:
            return "colocated"
        return "conditional" if self.spec.transfer.max_local_prefill_tokens > 0 else "disaggregated"


def _split(spec: Spec, num_prefill: int, num_decode: int) -> Spec:
    return attrs.evolve(spec, prefill=attrs.evolve(spec.prefill, replicas=num_prefill),
                        decode=attrs.evolve(spec.decode, replicas=num_decode))


def _conditional(spec: Spec, local_prefill_tokens: int) -> Spec:
    return attrs.evolve(spec, transfer=attrs.evolve(spec.transfer, max_local_prefill_tokens=local_prefill_tokens))


def _ratio_name(spec: Spec) -> str:
    return f"P{spec.prefill.replicas}:D{spec.decode.replicas}"


def machine_layouts(spec: Spec, cores: int, local_prefill_tokens: int = DEFAULT_LOCAL_PREFILL_TOKENS) -> list[Layout]:
    """The layouts of a CPU ``spec`` that fit ``cores`` (one core per unit, as `bench --compare` budgets).

    Every P:D with as many units as ``cores`` (at least P1:D1); colocated runs as many processes, all
    mixed (the same CPU budget); conditional runs the P1 split whose decode units compute short prompts.

    Raises:
        CompareError: a spec that is not a CPU spec, or fewer than 2 cores.
    """
    if spec.device != "cpu":
        raise CompareError(f"{spec.label}: layouts measured on this machine run a CPU spec; give device: cpu "
                           f"(or let the comparison derive one from a GPU spec: `machine_spec`)")
    if cores < 2:
        raise CompareError(f"a P/D comparison needs 2 cores for its 2 units, and this process may use {cores}")
    spec = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpus_per_node=cores))
    splits = [_split(spec, num_prefill, cores - num_prefill) for num_prefill in range(1, cores)]
    layouts = [Layout("colocated", splits[0], colocated=True)]  # as many mixed units as the splits have
    layouts += [Layout(_ratio_name(split), split) for split in splits]
    layouts.append(Layout(f"conditional {_ratio_name(splits[0])} (<= {local_prefill_tokens} tokens on decode)",
                          _conditional(splits[0], local_prefill_tokens)))
    return layouts


def machine_spec(target: Spec) -> Spec:
    """The spec measured on this machine for ``target``: a CPU spec as it is; a GPU spec as its tiny
    model on the CPU (`launch.tiny.tiny_spec`), one single-rank unit per role.

    Raises:
        CompareError: the target's model has no tiny variant.
    """
    if target.device == "cpu":
        return target
    from disaggsdk.launch.base import LaunchError
    from disaggsdk.launch.tiny import tiny_spec

    try:
        tiny = tiny_spec(target)
    except LaunchError as exc:
        raise CompareError(f"cannot measure {target.label} on this machine: {exc}") from None
    single = {"replicas": 1, "tp": 1, "dp": 1, "ep": 1}
    return attrs.evolve(tiny, prefill=attrs.evolve(tiny.prefill, **single),
                        decode=attrs.evolve(tiny.decode, **single),
                        hardware=attrs.evolve(tiny.hardware, gpus_per_node=2))


def target_layouts(spec: Spec, local_prefill_tokens: int = DEFAULT_LOCAL_PREFILL_TOKENS) -> list[Layout]:
    """The layouts of ``spec`` at its own scale: colocated, each P:D of its instance count where the
    roles' instances hold as many devices (else the spec's P:D alone), and conditional on the spec's P:D."""
    layouts = [Layout("colocated", spec, colocated=True)]
    p, d = spec.prefill, spec.decode
    total = p.replicas + d.replicas
    alike = (p.tp, p.dp, p.ep) == (d.tp, d.dp, d.ep)
    splits = [_split(spec, n, total - n) for n in range(1, total)] if alike else [spec]
    layouts += [Layout(_ratio_name(s), s) for s in splits]
    layouts.append(Layout(f"conditional {_ratio_name(spec)} (<= {local_prefill_tokens} tokens on decode)",
                          _conditional(spec, local_prefill_tokens)))
    return layouts


def sim_requests(requests: Sequence[BenchRequest], rate: float, seed: int) -> list[SimRequest]:
    """``requests`` as the simulator's, arriving as bench sends them at ``rate`` with ``seed``
    (`serve_bench.arrival_gaps_s`: the very gaps of the measured run)."""
    gaps = arrival_gaps_s(LoadShape(qps=rate, seed=seed), len(requests))
    out, at_s = [], 0.0
    for i, (req, gap_s) in enumerate(zip(requests, gaps)):
        out.append(SimRequest(i, at_s, max(2, req.prompt_len), req.output_len))
        at_s += gap_s
    return out


def simulated_run(layout: Layout, config: SimConfig, requests: Sequence[BenchRequest], rate: float,
                  seed: int) -> BenchResult:
    """One simulated run of a sweep: the summary with bench's keys (``slo_attainment`` among them)."""
    return Simulation(layout.spec, attrs.evolve(config, colocated=layout.colocated)).run(
        sim_requests(requests, rate, seed))


def target_sim_config(spec: Spec, slos_ms: dict[str, float], profile: HardwareProfile | None = None) -> SimConfig:
    """The simulator's settings for ``spec`` on its own hardware (its GPU's profile unless given, the
    format its model's checkpoint ships in)."""
    return SimConfig(profile or load_profile(default_profile_name(spec)), weight_dtype=default_weight_dtype(spec.model),
                     max_num_batched_tokens=spec.engine.max_num_batched_tokens, streaming=spec.transfer.streaming,
                     percentiles=PERCENTILES, slos_ms=dict(slos_ms))


def _error(simulated: float, measured: float) -> float | None:
    return simulated / measured - 1 if simulated > 0 and measured > 0 else None


@attrs.frozen
class MeasuredLayout:
    """A layout's measured sweep, and the simulator's settings for this machine at the speed the
    `SpeedMonitor` saw during it."""

    layout: Layout
    sweep: GoodputSweep
    config: SimConfig


def bench_trace_in_subprocess(url: str, draws: TraceDraws, rate: float, seed: int, num_prompts: int,
                              slos_ms: dict[str, float]) -> BenchResult:
    """One run of `disaggsdk bench URL --dataset-path TRACE` (the draw ``draws(seed, num_prompts)``) in a
    process of its own (`validate.bench_cli_in_subprocess` says why); its JSON result.

    Raises:
        BenchError: the benchmark failed.
    """
    return bench_cli_in_subprocess(url, [
        "--dataset-name", draws.dataset_name, "--dataset-path", str(draws.path), "--num-prompts", str(num_prompts),
        "--seed", str(seed), "--request-rate", "inf" if math.isinf(rate) else repr(rate),
        "--goodput", *(f"{name}:{limit:g}" for name, limit in slos_ms.items()),
        "--metric-percentiles", ",".join(f"{p:g}" for p in PERCENTILES)])


def measure_layout(layout: Layout, draws: TraceDraws, sweep: RateSweep, slos_ms: dict[str, float],
                   num_prompts: int, profile: HardwareProfile, seed: int, *, launch: LayoutLauncher,
                   monitor: SpeedMonitor | None = None, on_run: Callable[[str], None] | None = None) -> MeasuredLayout:
    """Launch ``layout``, sweep it with the trace (each run a `bench_trace_in_subprocess`, whose draw of
    the trace is ``draws(run_seed, num_prompts)``), tear it down.

    Args:
        monitor: a running `calibrate.speed_monitor.SpeedMonitor` (None: simulate on ``profile`` as it is).
        on_run: called with a line as each measured run starts (progress for a person).
    """
    from disaggsdk.calibrate.speed_monitor import retimed

    def measured_at(deployment: LaunchedLayout) -> Callable[[float, int], BenchResult]:
        def run_at(rate: float, run_seed: int) -> BenchResult:
            if on_run is not None:
                on_run(f"{layout.name} @ {'inf' if math.isinf(rate) else f'{rate:.3g}'} req/s")
            started_s = time.monotonic()
            result = bench_trace_in_subprocess(deployment.url, draws, rate, run_seed, num_prompts, slos_ms)
            phases = deployment.ttft_phases(started_s)  # where a disaggregated TTFT went (`report.ttft_phases`)
            if phases and phases["requests"]:
                result["ttft_phases"] = phases
            return result
        return run_at

    start_s = time.monotonic()
    with launch(layout.spec, colocated=layout.colocated, port=0) as deployment:
        deployment.wait_until_compiled()  # the sweep measures the compiled step, as a settled deployment runs
        measured = run_sweep(measured_at(deployment), sweep, slos_ms, seed)
    speed = monitor.speed_since(start_s) if monitor is not None else None
    return MeasuredLayout(layout, measured,
                          machine_sim_config(layout.spec, retimed(profile, speed) if speed is not None else profile,
                                             slos_ms=slos_ms, percentiles=PERCENTILES))


def flat_out_ratio(m: MeasuredLayout, requests_for: RequestsFor, num_prompts: int, seed: int) -> float | None:
    """How much more the simulator completes flat out than the layout did: simulated over measured
    throughput of the sweep's flat-out runs, each simulated on its very requests (None: no such run)."""
    rows = [r for r in m.sweep["sweep"] if r["request_rate"] == "inf" and r["request_throughput"] > 0]
    if not rows:
        return None
    simulated = sum(simulated_run(m.layout, m.config, requests_for(first_run_seed(seed, r["round"]), num_prompts),
                                  math.inf, first_run_seed(seed, r["round"]))["request_throughput"] for r in rows)
    return simulated / sum(r["request_throughput"] for r in rows)


def leave_one_out_slowdowns(ratios: Sequence[float | None]) -> list[tuple[float, list[int]]]:
    """For each layout, the slowdown to simulate it with: the geometric mean of the *other* layouts'
    `flat_out_ratio`s, and which layouts those were (1.0 and none where no other has one). A layout's
    own runs never tune its own figure, so its agreement with them is a prediction, not a fit."""
    out = []
    for i in range(len(ratios)):
        others = [j for j, r in enumerate(ratios) if j != i and r is not None and r > 0]
        product = math.prod(ratios[j] or 1.0 for j in others)
        out.append((product ** (1 / len(others)) if others else 1.0, others))
    return out


def simulate_measured(m: MeasuredLayout, slowdown: float, fitted_on: Sequence[str], requests_for: RequestsFor,
                      sweep: RateSweep, slos_ms: dict[str, float], num_prompts: int, seed: int) -> LayoutGoodput:
    """The simulator's sweep of a measured layout through the very same requests and arrivals, on the
    profile re-timed to its run's speed and slowed by ``slowdown`` (fitted on the layouts ``fitted_on``)."""
    config = attrs.evolve(m.config, profile=m.config.profile.slowed_by(slowdown))
    simulated = run_sweep(lambda rate, run_seed: simulated_run(m.layout, config, requests_for(run_seed, num_prompts),
                                                               rate, run_seed), sweep, slos_ms, seed)
    measured_rate = m.sweep["goodput_request_rate"]
    return LayoutGoodput(layout=m.layout.name, kind=m.layout.kind, where="this machine", measured=m.sweep,
                         simulated=simulated, goodput_request_rate=measured_rate,
                         simulated_error=_error(simulated["goodput_request_rate"], measured_rate),
                         sim_slowdown=slowdown, sim_fitted_on=list(fitted_on))


def simulate_layout(layout: Layout, config: SimConfig, requests_for: RequestsFor, sweep: RateSweep,
                    slos_ms: dict[str, float], seed: int, num_requests: int = TARGET_REQUESTS) -> LayoutGoodput:
    """Sweep ``layout`` in the simulator alone (one round: it is deterministic for a given draw)."""
    simulated = run_sweep(lambda rate, run_seed: simulated_run(layout, config, requests_for(run_seed, num_requests),
                                                               rate, run_seed),
                          dataclasses.replace(sweep, rounds=1), slos_ms, seed)
    return LayoutGoodput(layout=layout.name, kind=layout.kind, where=f"{config.profile.name} (simulated)",
                         measured=None, simulated=simulated, goodput_request_rate=simulated["goodput_request_rate"],
                         simulated_error=None, sim_slowdown=None, sim_fitted_on=[])


def recommend(results: Sequence[LayoutGoodput], where: str) -> str:
    """The layout with the highest goodput and why: its rate against the runner-up's, and what limited
    each of the others (the SLO they missed first, and the phase behind a TTFT miss where measured)."""
    if not results:
        return f"{where}: nothing was compared"
    ranked = sorted(results, key=lambda r: r["goodput_request_rate"], reverse=True)
    best = ranked[0]
    if best["goodput_request_rate"] <= 0:
        return (f"{where}: no layout met the SLOs for the target share of requests even at the lowest rate tried; "
                f"loosen the SLOs or add capacity")
    parts = [f"{where}: {best['layout']}, {best['goodput_request_rate']:.2f} req/s"]
    if len(ranked) > 1:
        runner = ranked[1]
        ratio = (f"{best['goodput_request_rate'] / runner['goodput_request_rate']:.2f}x"
                 if runner["goodput_request_rate"] > 0 else "where it met none")
        parts.append(f"{ratio} {runner['layout']}'s {runner['goodput_request_rate']:.2f}")
        parts += _noise_caveat(best, runner)
    for r in ranked[1:]:
        sweep = r["measured"] or r["simulated"]
        if sweep["limited_by"]:
            parts.append(f"{r['layout']}: {limit_text(sweep['limited_by'])}")
    return "; ".join(parts)


def _noise_caveat(best: LayoutGoodput, runner: LayoutGoodput) -> list[str]:
    """Whether measured rounds can tell the best layout from the runner-up (a shared VM's run-to-run
    spread is 10-25%): [] where they can or nothing was measured."""
    mine, theirs = best["measured"], runner["measured"]
    if mine is None or theirs is None:
        return []
    if len(mine["goodput_rounds"]) < 2:
        return ["one round each: --repeat 3 gives each layout a range to tell close ones apart"]
    if mine["goodput_range"][0] <= theirs["goodput_range"][1]:
        return [f"not told apart from {runner['layout']}: their rounds' ranges overlap "
                f"({mine['goodput_range'][0]:.2f}-{mine['goodput_range'][1]:.2f} and "
                f"{theirs['goodput_range'][0]:.2f}-{theirs['goodput_range'][1]:.2f} req/s)"]
    return []


def compare_layouts(layouts: Sequence[Layout], draws: TraceDraws, sweep: RateSweep,
                    slos_ms: dict[str, float], profile: HardwareProfile, *, launch: LayoutLauncher,
                    num_prompts: int = 40, seed: int = 0, targets: Sequence[Spec] = (),
                    on_run: Callable[[str], None] | None = None) -> Comparison:
    """Measure every layout of this machine (each also simulated), then simulate each target's layouts.

    Args:
        layouts: this machine's (`machine_layouts`), all of one machine spec.
        draws: the user's trace, drawn by (seed, n) alike for a measured run and its simulated twin.
        profile: this machine's calibrated profile (``cpu-local``).
        launch: starts a deployment (`disaggsdk.face.deployment.launch`, handed in by the face).
        targets: specs at their own scale, simulated on their hardware's profile (`target_goodput`).
    Returns:
        a `Comparison`: per layout the goodput (measured and simulated here; simulated at each target),
        and a recommendation with its reason for this machine and for each target.
    """
    from disaggsdk.calibrate.speed_monitor import SpeedMonitor, has_speed

    if not layouts:
        raise CompareError("no layout to measure")
    with SpeedMonitor() if has_speed(profile) else contextlib.nullcontext() as monitor:
        measured = [measure_layout(layout, draws, sweep, slos_ms, num_prompts, profile, seed, launch=launch,
                                   monitor=monitor, on_run=on_run) for layout in layouts]
    # the simulator calibrated on those runs: what the machine under this load really completes, from
    # the other layouts' flat-out runs (`leave_one_out_slowdowns`)
    ratios = [flat_out_ratio(m, draws, num_prompts, seed) for m in measured]
    here = [simulate_measured(m, slowdown, [layouts[j].name for j in others], draws, sweep, slos_ms,
                              num_prompts, seed)
            for m, (slowdown, others) in zip(measured, leave_one_out_slowdowns(ratios))]
    local_prefill_tokens = max(layout.spec.transfer.max_local_prefill_tokens for layout in layouts)
    return Comparison(slos_ms=dict(slos_ms), slo_attainment_target=sweep.target, machine_spec=layouts[0].spec.label,
                      profile=profile.name, this_machine=here,
                      recommendation=recommend(here, "on this machine (measured)"),
                      targets=[target_goodput(t, draws, sweep, slos_ms, seed,
                                              local_prefill_tokens or DEFAULT_LOCAL_PREFILL_TOKENS, on_run=on_run)
                               for t in targets])


def target_goodput(target: Spec, requests_for: RequestsFor, sweep: RateSweep, slos_ms: dict[str, float],
                   seed: int = 0, local_prefill_tokens: int = DEFAULT_LOCAL_PREFILL_TOKENS,
                   profile: HardwareProfile | None = None, num_requests: int = TARGET_REQUESTS,
                   on_run: Callable[[str], None] | None = None) -> TargetGoodput:
    """Every layout of ``target`` at its own scale (`target_layouts`), simulated on its hardware's profile
    (or ``profile``) with the trace's lengths, ``num_requests`` a run, and the layout to choose there
    with its reason.

    Raises:
        SpecError: a layout whose ranks do not fit their devices' memory.
    """
    config = target_sim_config(target, slos_ms, profile)
    results = []
    for layout in target_layouts(target, local_prefill_tokens):
        if on_run is not None:
            on_run(f"simulating {target.label}: {layout.name} on {config.profile.name}")
        results.append(simulate_layout(layout, config, requests_for, sweep, slos_ms, seed, num_requests))
    return TargetGoodput(spec=target.label, profile=config.profile.name, layouts=results,
                         recommendation=recommend(results, f"{target.label} on {config.profile.name} (simulated)"))
