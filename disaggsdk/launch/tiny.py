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
    transport becomes shm. A role's ``ep`` stays: each tiny rank holds its share of the routed experts
    and the dp ranks of an expert-parallel instance step in lock-step, as on the GPUs.

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
    )


def check_runnable(spec: Spec) -> None:
    """Refuse a GPU spec, saying what to run instead.

    Without CUDA the spec needs hardware this machine lacks; with CUDA it still cannot run here
    yet: units share their KV pools as host memfd regions, and the cuMem path
    (`disaggsdk.memory.cuda_vmm`) is not wired into them.

    Raises:
        LaunchError: ``device: cuda``.
    """
    if spec.device != "cuda":
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        ranks = sum(r.replicas * r.tp * r.dp for r in (spec.prefill, spec.decode))
        raise LaunchError(
            f"{spec.label} needs {ranks} CUDA GPUs ({spec.hardware.gpu}) and this machine has none; "
            f"run it on the CPU with its tiny model: add --tiny (LocalRuntime(spec, tiny=True))"
        )
    raise LaunchError(
        f"{spec.label}: the local runtime runs CPU units only for now (KV pools are host memfd regions, "
        f"CUDA pools are not wired in); add --tiny to run the same topology on the CPU"
    )
