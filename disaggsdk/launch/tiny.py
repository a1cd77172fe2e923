"""`--tiny`: run a GPU spec on a CPU with the tiny variant of its model and the same topology."""

from __future__ import annotations

import attrs

from disaggsdk.launch.base import LaunchError
from disaggsdk.models import TINY_VARIANT, is_tiny
from disaggsdk.spec.types import Spec


def tiny_spec(spec: Spec) -> Spec:
    """The same instances, tp, dp and routes with the model's tiny variant, on the CPU.

    Weights are held in float32 and KV in float32 (tokens compare with transformers exactly) unless the spec's KV
    is fp8, which CPU units store too (its loss is what such a spec asks to see); "auto"
    transport becomes shm; ``launch.cuda_devices`` goes. A role's ``ep`` stays: each tiny rank holds
    its share of the routed experts and the dp ranks of an expert-parallel instance step in lock-step, as on the GPUs.

    Raises:
        LaunchError: the model has no tiny variant.
    """
    model = spec.model if is_tiny(spec.model) else TINY_VARIANT.get(spec.model)
    if model is None:
        raise LaunchError(f"{spec.model} has no tiny variant; tiny variants exist for {sorted(TINY_VARIANT)}")
    provider = "shm" if spec.transport.provider in ("auto", "efa", "verbs") else spec.transport.provider
    return attrs.evolve(
        spec, model=model, device="cpu", hardware=attrs.evolve(spec.hardware, gpu="cpu"),
        kv=attrs.evolve(spec.kv, dtype="fp8" if spec.kv.dtype == "fp8" else "float32"),
        transport=attrs.evolve(spec.transport, provider=provider),
        engine=attrs.evolve(spec.engine, dtype="float32"),
        launch=attrs.evolve(spec.launch, cuda_devices=()),  # no CUDA devices to map on the CPU
    )

