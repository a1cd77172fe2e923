"""The simulator's settings for a CPU spec launched on this machine (validation, layout comparison and
the autoscaler's preview all simulate a real run the same way)."""

from __future__ import annotations

import os

from disaggsdk.sim.hardware import HardwareProfile
from disaggsdk.sim.simulator import SimConfig
from disaggsdk.spec import Spec


def machine_sim_config(spec: Spec, profile: HardwareProfile, colocated: bool = False,
                       slos_ms: dict[str, float] | None = None,
                       percentiles: tuple[float, ...] = (50, 90, 99), client_shares_cores: bool = True) -> SimConfig:
    """The simulator's settings for a CPU spec launched on this machine: its engine settings, float32
    weights, and the units, the server and (``client_shares_cores``) the benchmark client sharing the
    cores, as a real run has them."""
    return SimConfig(profile, weight_dtype="float32", colocated=colocated,
                     max_num_batched_tokens=spec.engine.max_num_batched_tokens, streaming=spec.transfer.streaming,
                     shared_cores=len(os.sched_getaffinity(0)), client_shares_cores=client_shares_cores,
                     percentiles=percentiles, slos_ms=dict(slos_ms or {}))
