"""Run a set of simulations (rates x layouts) and collect them in one JSON-ready result."""

from __future__ import annotations

import time
from typing import Any

import attrs

from disaggsdk.sim.all_to_all import all_to_all_assumptions, wire_dtype
from disaggsdk.sim.simulator import SimConfig, Simulation
from disaggsdk.sim.workload import SimRequest, Workload, load_trace
from disaggsdk.spec import Spec, spec_to_dict

PROFILE_OF_GPU = {"h100": "h100", "h200": "h200", "cpu": "cpu-local"}


def default_profile_name(spec: Spec) -> str:
    """The profile matching the spec's hardware (cpu -> the calibrated ``cpu-local``)."""
    return PROFILE_OF_GPU[spec.hardware.gpu]


def run_simulations(spec: Spec, config: SimConfig, layouts: list[bool], rates: list[float] | None = None,
                    trace: str | None = None, duration_s: float = 600.0, input_len: int = 2048, output_len: int = 256,
                    range_ratio: float = 0.0, burstiness: float = 1.0, seed: int = 0) -> dict[str, Any]:
    """Simulate every (rate, layout) pair on the same arrivals per rate.

    Args:
        layouts: False for the spec's disaggregated layout, True for its colocated twin.
        rates: request rates (qps); ignored when ``trace`` is given.
    Returns:
        ``{"spec", "profile", "config", "runs": [summary + "qps" + "sim_wall_s"]}``; where a role spreads its
        experts (``ep > 1``) ``config["all_to_all"]`` holds that term's assumptions and the roles' ``ep``.
    """
    workloads: list[tuple[float | None, list[SimRequest]]] = []  # (qps, arrivals); a trace has no qps
    if trace:
        workloads.append((None, load_trace(trace)))
    else:
        for rate in rates or []:
            w = Workload(rate, duration_s, input_len, output_len, range_ratio, burstiness, seed)
            workloads.append((rate, w.requests()))
    runs = []
    for qps, requests in workloads:
        for colocated in layouts:
            start = time.perf_counter()
            summary = Simulation(spec, attrs.evolve(config, colocated=colocated)).run(requests)
            summary["qps"] = qps if qps is not None else len(requests) / max(r.arrival_s for r in requests)
            summary["sim_wall_s"] = time.perf_counter() - start
            runs.append(summary)
    settings: dict[str, Any] = {
        "weight_dtype": config.weight_dtype, "max_num_batched_tokens": config.max_num_batched_tokens,
        "streaming": config.streaming, "input_len": input_len, "output_len": output_len,
        "range_ratio": range_ratio, "duration_s": duration_s, "trace": trace}
    spread = {name: role.ep for name, role in (("prefill", spec.prefill), ("decode", spec.decode)) if role.ep > 1}
    if spread:
        settings["all_to_all"] = {"ep": spread, **all_to_all_assumptions(config.profile, wire_dtype(config.weight_dtype))}
    return {"spec": spec_to_dict(spec), "profile": config.profile.name, "config": settings, "runs": runs}
