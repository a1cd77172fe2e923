"""Check the simulator against real runs on this machine: same spec, same arrivals, same lengths.

Each layout (the spec as written, and its colocated twin) is launched for real, loaded by the
benchmark at each rate, and the very requests the benchmark sent (their send times, prompt and
output lengths) are replayed in the simulator on the calibrated ``cpu-local`` profile, with the
instances, the front end and the benchmark client sharing this machine's cores. Mean TTFT and
mean TPOT are compared.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from disaggsdk.sim.hardware import HardwareProfile
from disaggsdk.sim.machine_config import machine_sim_config
from disaggsdk.sim.simulator import Simulation
from disaggsdk.sim.workload import SimRequest
from disaggsdk.spec import Spec

if TYPE_CHECKING:
    from disaggsdk.bench.serve_bench import BenchResult


class Launcher(Protocol):
    """Starts a deployment: ``launch(spec, colocated=..., port=0)`` as `disaggsdk.face.deployment.launch`.

    The result is a context manager with ``url`` and ``backend.runtime.unit_cpu_s()``.
    """

    def __call__(self, spec: Spec, *, colocated: bool, port: int) -> Any: ...

TOLERANCE = 0.15


def trace_of(bench_result: dict[str, Any]) -> list[SimRequest]:
    """The requests a benchmark sent that finished, as a simulator trace."""
    rows = zip(bench_result["send_times_s"], bench_result["input_lens"], bench_result["output_lens"],
               bench_result["errors"])
    return [SimRequest(i, sent, n_in, n_out) for i, (sent, n_in, n_out, err) in enumerate(rows) if not err and n_out > 0]


def simulate_like(spec: Spec, profile: HardwareProfile, colocated: bool, requests: list[SimRequest]) -> dict[str, Any]:
    """Simulate ``requests`` on ``spec`` with the engine settings the real run used (`machine_sim_config`)."""
    return Simulation(spec, machine_sim_config(spec, profile, colocated)).run(requests)


def compare_row(layout: str, qps: float, measured: dict[str, Any], simulated: dict[str, Any]) -> dict[str, Any]:
    """Measured vs simulated mean TTFT and TPOT, with relative errors and the verdict."""
    row: dict[str, Any] = {"layout": layout, "qps": qps}
    for metric in ("mean_ttft_ms", "mean_tpot_ms"):
        m, s = measured[metric], simulated[metric]
        row[metric] = {"measured": m, "simulated": s, "error": (s - m) / m if m else float("inf")}
    row["within_tolerance"] = all(abs(row[k]["error"]) <= TOLERANCE for k in ("mean_ttft_ms", "mean_tpot_ms"))
    return row


def bench_cli_in_subprocess(url: str, options: Sequence[str]) -> BenchResult:
    """Run `disaggsdk bench URL OPTIONS` as its own process and return its JSON result.

    A separate process, as a real client would be: a benchmark loop sharing the server's process
    would also share its interpreter lock and blur the very latencies being measured.

    Raises:
        BenchError: the benchmark failed (the end of its stderr says why).
    """
    from disaggsdk.bench.serve_bench import BenchError

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        cmd = [sys.executable, "-m", "disaggsdk.cli.main", "bench", url, *options, "--output", str(out)]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=1800)
        if done.returncode != 0:
            raise BenchError(f"`disaggsdk bench {url} {' '.join(options)}` failed: {done.stderr.strip()[-500:]}")
        result: BenchResult = json.loads(out.read_text())
        return result


def bench_in_subprocess(url: str, qps: float, num_prompts: int, input_len: int, output_len: int,
                        range_ratio: float = 0.0, seed: int = 0, max_concurrency: int | None = None) -> BenchResult:
    """`bench_cli_in_subprocess` with random prompts of the given lengths."""
    options = ["--qps", str(qps), "--num-prompts", str(num_prompts), "--input-len", str(input_len), "--output-len",
               str(output_len), "--range-ratio", str(range_ratio), "--seed", str(seed)]
    if max_concurrency:
        options += ["--max-concurrency", str(max_concurrency)]
    return bench_cli_in_subprocess(url, options)


def validate(spec: Spec, profile: HardwareProfile, rates: list[float], num_prompts: int = 40,
             input_len: int = 256, output_len: int = 32, range_ratio: float = 0.5, seed: int = 0,
             repeat: int = 1, correct_speed: bool = True, *, launch: Launcher) -> list[dict[str, Any]]:
    """Launch, load and simulate each layout at each rate; one comparison row per (layout, rate).

    With ``repeat`` > 1 every rate is run that many times (round-robin over the rates, so a slow
    minute of a shared machine does not land on one rate) and each row compares the medians of
    the measured and of the simulated means; ``runs`` keeps every run's numbers.

    Args:
        launch: starts a deployment of ``spec`` (`disaggsdk.face.deployment.launch`; the face hands
            it in, so this layer never imports the one above it).
        correct_speed: simulate each run at the speed the monitor saw during it (needs the
            profile's ``monitor_*`` figures); False compares with the profile as calibrated.
    Returns:
        rows with measured / simulated / simulated_as_calibrated means, the relative error, the
        verdict, and the median speed factors of its runs (over calibration; > 1 is slower).
    """
    import statistics

    from disaggsdk.calibrate.speed_monitor import SpeedMonitor, has_speed, retimed, speed_factors

    metrics = ("mean_ttft_ms", "mean_tpot_ms")
    corrected = correct_speed and has_speed(profile)
    rows = []
    with SpeedMonitor() as monitor:
        for colocated in (False, True):
            layout = "colocated" if colocated else "disaggregated"
            runs: dict[float, list[dict[str, Any]]] = {qps: [] for qps in rates}
            with launch(spec, colocated=colocated, port=0) as deployment:
                deployment.wait_until_compiled()  # measure the compiled step, not the eager one meanwhile
                bench_in_subprocess(deployment.url, float("inf"), 4, input_len, 4, seed=seed + 99)  # warm-up
                for _ in range(max(1, repeat)):
                    for qps in rates:
                        start_s = time.monotonic()
                        bench = bench_in_subprocess(deployment.url, qps, num_prompts, input_len, output_len,
                                                    range_ratio, seed)
                        speed = monitor.speed_since(start_s)
                        at_speed = retimed(profile, speed) if corrected else profile
                        decode_factor, prefill_factor = speed_factors(profile, speed)
                        sims = {"simulated": simulate_like(spec, at_speed, colocated, trace_of(bench)),
                                "simulated_as_calibrated": simulate_like(spec, profile, colocated, trace_of(bench))}
                        runs[qps].append({"decode_speed_factor": decode_factor, "prefill_speed_factor": prefill_factor}
                                         | {k: {"measured": bench[k]} | {side: sim[k] for side, sim in sims.items()}
                                            for k in metrics})
            for qps, qps_runs in runs.items():
                median = {side: {k: statistics.median(r[k][side] for r in qps_runs) for k in metrics}
                          for side in ("measured", "simulated", "simulated_as_calibrated")}
                row = compare_row(layout, qps, median["measured"], median["simulated"])
                row["speed_corrected"] = corrected
                for factor in ("decode_speed_factor", "prefill_speed_factor"):
                    row[factor] = statistics.median(r[factor] for r in qps_runs)
                for k in metrics:
                    row[k]["simulated_as_calibrated"] = median["simulated_as_calibrated"][k]
                row["runs"] = qps_runs
                rows.append(row)
    return rows
