"""Fit a hardware profile to this machine by timing the real engine.

The engine runs prefills of several lengths and decode steps at several batch sizes and
contexts; each step's wall time is paired with the FLOPs, bytes and sequences the cost model
counts for it, and the profile's rates (matrix rate, memory bandwidth, fixed per-step time) are
fitted to minimise the relative error. The result is written as ``cpu-local.yaml`` in the user's
profile folder, where `load_profile("cpu-local")` finds it. What a deployment adds on top is
fitted by `disaggsdk.calibrate.serving`.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from pathlib import Path
from typing import Any

import attrs
import yaml

from disaggsdk.calibrate.speed_monitor import SpeedMonitor
from disaggsdk.models import ModelArch, resolve_model
from disaggsdk.sim.cost_model import StepCostModel, prefill_context_pairs
from disaggsdk.sim.hardware import HardwareProfile


@attrs.frozen
class StepSample:
    """One timed engine step and the work the cost model sees in it."""

    num_tokens: int
    num_sequences: int
    context_pairs: float
    kv_read_tokens: float
    seconds: float


def time_engine(model: str, prefill_lens=(32, 128, 512, 1024), decode_batches=(1, 4, 16),
                decode_contexts=(64, 512), decode_steps: int = 8, page_size: int = 16,
                repeats: int = 3, threads: int = 1, rounds: int = 1) -> list[StepSample]:
    """Time the local engine (tp=1, float32, mixed mode) on a grid of prefills and decode steps.

    Each sample is the median of ``repeats`` prefills or ``decode_steps`` decode steps, so one
    step slowed by another process does not skew the fit. Run it on a quiet machine. ``threads``
    is torch's thread count: 1, as each deployed unit runs (`disaggsdk.launch`). With ``rounds`` >
    1 the whole grid is timed that many times and each sample is the median over the rounds: one
    pass takes about 6 s on the development VM, shorter than that VM's swings of speed.
    """
    import torch

    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams

    longest = max(max(prefill_lens), max(decode_contexts)) + decode_steps + 8
    num_pages = (max(decode_batches) + 1) * (-(-longest // page_size)) + 8
    # no prefix cache: every timed prefill repeats one prompt, and with the cache on each repeat
    # after the first computed only its last token (the fit then saw a 1,024-token prefill take
    # a tenth of its real time)
    engine = LLMEngine(model, EngineConfig(page_size=page_size, num_pages=num_pages, prefix_caching=False,
                                           max_num_batched_tokens=max(prefill_lens), max_num_seqs=64,
                                           compile_in_background=False))  # timed compiled, as units run
    ids = itertools.count()

    def one_round() -> list[StepSample]:
        samples = []
        for n in prefill_lens:
            times = []
            for _ in range(repeats + 1):  # median of repeats: one step may be hit by a neighbour's burst
                engine.add_request(f"p{next(ids)}", [7] * n, SamplingParams(max_tokens=1, ignore_eos=True))
                start = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start)
                while engine.has_unfinished():
                    engine.step()
            times = times[1:]  # the first run of a shape pays for allocations
            samples.append(StepSample(n, 1, prefill_context_pairs(n, 0), n, statistics.median(times)))
        for batch, context in itertools.product(decode_batches, decode_contexts):
            params = SamplingParams(max_tokens=decode_steps + 2, ignore_eos=True)
            for _ in range(batch):
                engine.add_request(f"d{next(ids)}", [5] * context, params)
            scheduler = engine.scheduler
            while any(r.num_computed_tokens < len(r.prompt_ids) for r in scheduler.running + list(scheduler.waiting)):
                engine.step()
            times = []
            for _ in range(decode_steps):
                start = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start)
            length = context + decode_steps // 2 + 1  # contexts grow by one a step: take the middle
            samples.append(StepSample(batch, batch, batch * length, batch * length, statistics.median(times)))
            while engine.has_unfinished():
                engine.step()
        return samples

    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        engine.generate([[1] * 64], SamplingParams(max_tokens=4))  # warm-up: first-call costs stay out
        passes = [one_round() for _ in range(max(1, rounds))]
    finally:
        engine.close()
        torch.set_num_threads(threads_before)
    return [attrs.evolve(same[0], seconds=statistics.median(s.seconds for s in same)) for same in zip(*passes)]


def _relative_error(profile: HardwareProfile, arch: ModelArch, samples: list[StepSample]) -> float:
    cost = StepCostModel(arch, profile, weight_dtype="float32", kv_dtype="float32")
    return math.fsum(
        ((cost.step_time_s(s.num_tokens, s.num_sequences, s.context_pairs, s.kv_read_tokens) - s.seconds) / s.seconds) ** 2
        for s in samples) / len(samples)


def fit_profile(arch: ModelArch, samples: list[StepSample], name: str = "cpu-local") -> tuple[HardwareProfile, float]:
    """Fit matrix rate, memory bandwidth and per-step overhead; return (profile, RMS relative error)."""
    base = HardwareProfile(
        name=name, hbm_gb_per_s=10.0, bf16_tflops=0.05, fp8_tflops=0.05, nvlink_gb_per_s=5.0,
        nics_per_node=1, nic_gbps=40.0, memory_gb=16.0, flops_efficiency=1.0, bandwidth_efficiency=1.0,
        nvlink_efficiency=1.0, allreduce_latency_us=550.0, step_overhead_ms=1.0, kernel_overhead_us_per_layer=0.0,
        transfer_write_overhead_us=10.0,
        sources={
            "rates": f"fitted by `disaggsdk calibrate` on {len(samples)} timed steps of {arch.name}",
            "allreduce": "docs/machine-facts.md: gloo all-reduce of 8x512 float32 on loopback ~0.55 ms",
            "nic": "docs/machine-facts.md: libfabric shm 5.5 GB/s at 64 KiB writes (~40 Gbit/s)",
        },
    )
    best = (float("inf"), base)
    for round_ in range(8):  # coordinate search in log space, the window narrowing each round
        width = 4.0 ** (0.6 ** max(0, round_ - 1))
        for field, lo, hi in (("bf16_tflops", 1e-3, 10.0), ("hbm_gb_per_s", 0.1, 1000.0), ("step_overhead_ms", 0.01, 100.0)):
            current = getattr(best[1], field)
            span = (lo, hi) if round_ == 0 else (current / width, current * width)
            for i in range(40):
                value = span[0] * (span[1] / span[0]) ** (i / 39)
                changes = {field: value}
                if field == "bf16_tflops":
                    changes["fp8_tflops"] = value
                candidate = attrs.evolve(best[1], **changes)
                err = _relative_error(candidate, arch, samples)
                if err < best[0]:
                    best = (err, candidate)
    return best[1], math.sqrt(best[0])


def calibrate_engine(model: str, monitor: SpeedMonitor | None = None, name: str = "cpu-local",
                     **grid: Any) -> tuple[HardwareProfile, float, list[StepSample]]:
    """Time the engine (`time_engine`, ``grid`` its keywords) and fit a profile to the samples.

    Args:
        monitor: a running `SpeedMonitor`; the profile then records the machine's speed during the
            timing (``monitor_*``), which lets validation follow a drifting VM (`retimed`).
    Returns:
        (profile, RMS relative error of the fit, the samples)
    """
    start_s = time.monotonic()
    samples = time_engine(model, **grid)
    profile, rms = fit_profile(resolve_model(model), samples, name=name)
    speed = monitor.speed_since(start_s) if monitor is not None else None
    if speed is not None:
        profile = attrs.evolve(profile, monitor_prefill_cpu_ms=speed.prefill_cpu_ms,
                               monitor_decode_step_cpu_ms=speed.decode_step_cpu_ms)
    return profile, rms, samples


def save_profile(profile: HardwareProfile, path: Path) -> Path:
    """Write ``profile`` as YAML (the format `load_profile` reads)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = attrs.asdict(profile)
    for key, value in data.items():
        if isinstance(value, float):
            data[key] = float(f"{value:.6g}")
    path.write_text("# Written by `disaggsdk calibrate`; fitted to this machine.\n" + yaml.safe_dump(data, sort_keys=False))
    return path
