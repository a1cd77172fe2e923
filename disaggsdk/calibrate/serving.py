"""Fit what the serving stack adds beyond the engine, on a real deployment of a CPU spec."""

from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, TypedDict

import attrs

from disaggsdk.sim.hardware import HardwareProfile

if TYPE_CHECKING:
    from disaggsdk.calibrate.engine_profile import StepSample
    from disaggsdk.calibrate.validate import Launcher
    from disaggsdk.spec import Spec
from disaggsdk.calibrate.speed_monitor import MachineSpeed, SpeedMonitor, retimed, speed_factors


class LayoutFit(TypedDict):
    """One layout's serving turns, as `fit_serving_overheads` reports them."""

    mean_ttft_ms: float  # median over the turns
    mean_tpot_ms: float  # median over the turns
    speed_factors: list[float]  # each turn's slowdown against the engine timing


class ServingFit(TypedDict):
    """The measurements behind a serving fit (written into `disaggsdk calibrate`'s JSON)."""

    disaggregated: LayoutFit
    colocated: LayoutFit

IDLE_WINDOW_S = 2.0  # how long the idle units' polling is measured


@attrs.frozen
class ServingTurn:
    """One layout's measurements in one calibration turn, at the speed it ran (``speed``)."""

    colocated: bool
    speed: MachineSpeed | None  # the monitor's medians over the turn (None: no monitor)
    bench: dict  # `disaggsdk bench` result of the sequential requests (its trace replays)
    server_cpu_ms_per_token: float
    server_cpu_ms_per_request: float
    client_cpu_ms_per_token: float
    client_cpu_ms_per_request: float
    idle_unit_cores: float  # mean over the deployment's units


def _per_token_and_request(long_cpu_s: float, long_tokens: int, short_cpu_s: float, short_tokens: int,
                           num_requests: int) -> tuple[float, float]:
    """Split CPU time into (ms per token, ms per request) from two runs of the same requests."""
    per_token_s = max(0.0, (long_cpu_s - short_cpu_s) / max(1, long_tokens - short_tokens))
    per_request_s = max(0.0, (short_cpu_s - per_token_s * short_tokens) / num_requests)
    return per_token_s * 1e3, per_request_s * 1e3


def measure_turn(spec, colocated: bool, monitor: SpeedMonitor | None, num_requests: int, input_len: int,
                 output_len: int, arrival_qps: float, *, launch: Launcher) -> ServingTurn:
    """Launch one layout, measure its idle units, then send requests one at a time."""
    from disaggsdk.calibrate.validate import bench_in_subprocess

    with launch(spec, colocated=colocated, port=0) as deployment:
        deployment.wait_until_compiled()  # idle cores of units that are done compiling
        bench_in_subprocess(deployment.url, math.inf, 4, input_len, 4, seed=99)  # warm-up
        units_before, wall_before = deployment.backend.runtime.unit_cpu_s(), time.monotonic()
        time.sleep(IDLE_WINDOW_S)
        units_after, idle_wall_s = deployment.backend.runtime.unit_cpu_s(), time.monotonic() - wall_before
        idle_cores = statistics.fmean((units_after[n] - units_before[n]) / idle_wall_s for n in units_after)

        # one at a time, arriving at an idle deployment as light traffic does (not back to back: a
        # deployment kept hot answers faster than one woken by each request)
        server_before, start_s = time.process_time(), time.monotonic()
        long = bench_in_subprocess(deployment.url, arrival_qps, num_requests, input_len, output_len,
                                   max_concurrency=1)
        server_long_s = time.process_time() - server_before
        server_before = time.process_time()  # the same requests with one output token: the per-request part
        short = bench_in_subprocess(deployment.url, math.inf, num_requests, input_len, 1, max_concurrency=1)
        server_short_s = time.process_time() - server_before
        speed = monitor.speed_since(start_s) if monitor is not None else None

    long_tokens, short_tokens = sum(long["output_lens"]), sum(short["output_lens"])
    server = _per_token_and_request(server_long_s, long_tokens, server_short_s, short_tokens, num_requests)
    client = _per_token_and_request(long["client_cpu_s"], long_tokens, short["client_cpu_s"], short_tokens,
                                    num_requests)
    return ServingTurn(colocated, speed, long, *server, *client, idle_cores)


def fit_serving_overheads(spec, profile: HardwareProfile, num_requests: int = 24, input_len: int = 256,
                          output_len: int = 32, arrival_qps: float = 2.0, repeats: int = 3,
                          monitor: SpeedMonitor | None = None, *,
                          launch: Launcher) -> tuple[HardwareProfile, ServingFit]:
    """Add what the serving stack costs beyond the engine, measured on a real deployment of ``spec``.

    Args:
        profile: the engine calibration; with its ``monitor_*`` speed, turns are brought back to it.
        monitor: the `SpeedMonitor` running since the engine timing (None: no speed correction).
        launch: starts a deployment (`disaggsdk.face.deployment.launch`, handed in by the face).
    Returns:
        (the profile with the serving fields set, the measurements behind them)
    """
    from disaggsdk.calibrate.validate import simulate_like, trace_of

    turns = [measure_turn(spec, colocated, monitor, num_requests, input_len, output_len, arrival_qps, launch=launch)
             for _ in range(max(1, repeats)) for colocated in (False, True)]

    def factor(t: ServingTurn) -> float:
        """How much slower than the engine timing the machine ran during ``t`` (its decode steps)."""
        return speed_factors(profile, t.speed)[0]

    def median_of(values) -> float:
        return statistics.median(list(values))

    # CPU costs first (the latency fits below simulate with them), at the engine timing's speed
    profile = attrs.evolve(
        profile,
        frontend_cpu_ms_per_token=median_of(t.server_cpu_ms_per_token / factor(t) for t in turns),
        frontend_cpu_ms_per_request=median_of(t.server_cpu_ms_per_request / factor(t) for t in turns),
        client_cpu_ms_per_token=median_of(t.client_cpu_ms_per_token / factor(t) for t in turns),
        client_cpu_ms_per_request=median_of(t.client_cpu_ms_per_request / factor(t) for t in turns),
        idle_unit_cores=median_of(t.idle_unit_cores / factor(t) for t in turns if t.colocated),
        idle_messenger_unit_cores=median_of(t.idle_unit_cores / factor(t) for t in turns if not t.colocated),
    )

    def gap_ms(p: HardwareProfile, colocated: bool, metric: str) -> float:
        """Median over the layout's turns of measured minus simulated, each at its turn's speed, then
        brought back to the engine timing's speed."""
        return median_of(
            (t.bench[metric] - simulate_like(spec, retimed(p, t.speed), colocated, trace_of(t.bench))[metric])
            / factor(t) for t in turns if t.colocated == colocated)

    # per step: what every unit's loop adds (colocated), then what a messenger adds on top
    profile = attrs.evolve(profile, step_overhead_ms=profile.step_overhead_ms
                           + max(0.0, gap_ms(profile, True, "mean_tpot_ms")))
    profile = attrs.evolve(profile, messenger_step_overhead_ms=max(0.0, gap_ms(profile, False, "mean_tpot_ms")))
    profile = attrs.evolve(profile, request_overhead_ms=max(0.0, gap_ms(profile, True, "mean_ttft_ms")))
    profile = attrs.evolve(profile, handoff_overhead_ms=max(0.0, gap_ms(profile, False, "mean_ttft_ms")))
    sources = dict(profile.sources, serving=f"fitted on {max(1, repeats)} x {num_requests} sequential requests "
                                            f"to {spec.label}, each layout; CPU costs from the processes' CPU time")
    profile = attrs.evolve(profile, sources=sources)
    def layout_fit(colocated: bool) -> LayoutFit:
        mine = [t for t in turns if t.colocated == colocated]
        return LayoutFit(mean_ttft_ms=median_of(t.bench["mean_ttft_ms"] for t in mine),
                         mean_tpot_ms=median_of(t.bench["mean_tpot_ms"] for t in mine),
                         speed_factors=[factor(t) for t in mine])

    return profile, ServingFit(disaggregated=layout_fit(False), colocated=layout_fit(True))


def calibrate_machine(model: str, spec: Spec | None = None, *, launch: Launcher | None = None, name: str = "cpu-local",
                      rounds: int = 5) -> tuple[HardwareProfile, float, list[StepSample], ServingFit | None]:
    """What `disaggsdk calibrate [--deployment SPEC]` fits: this machine's engine timed (``model``,
    ``rounds`` passes of the grid), then, with ``spec``, the serving stack on a real deployment of it,
    one `SpeedMonitor` running through both so that the serving turns are brought back to the
    engine timing's speed.

    Args:
        launch: starts ``spec`` (`disaggsdk.face.deployment.launch`, handed in by the face); needed with ``spec``.
    Returns:
        (the profile, the engine fit's RMS relative error, its samples, the serving measurements or None).
    Raises:
        ValueError: a ``spec`` and no ``launch``.
    """
    from disaggsdk.calibrate.engine_profile import calibrate_engine

    if spec is not None and launch is None:
        raise ValueError("calibrating the serving stack on a spec needs the launch that starts it")

    serving = None
    with SpeedMonitor() as monitor:
        profile, rms, samples = calibrate_engine(model, monitor, name=name, rounds=rounds)
        if spec is not None and launch is not None:
            profile, serving = fit_serving_overheads(spec, profile, monitor=monitor, launch=launch)
    return profile, rms, samples, serving
