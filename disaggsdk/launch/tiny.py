"""`--tiny`: run a GPU spec on a CPU with the tiny variant of its model and the same topology."""

from __future__ import annotations

import logging

import attrs

from disaggsdk.launch.base import LaunchError
from disaggsdk.models import TINY_VARIANT, is_tiny
from disaggsdk.spec.types import Spec

log = logging.getLogger(__name__)

# what `--tiny` says when it drops a role's `ep` (the engine runs no expert parallelism yet: issue 36)
EP_DROPPED_NOTE = ("--tiny: {roles} ep dropped to 1: each tiny unit holds every expert until expert "
                   "parallelism lands (issue 36)")


class ExpertParallelismUnavailable(LaunchError):
    """The spec shards routed experts (``ep > 1``), which the engine does not run yet."""


def tiny_spec(spec: Spec) -> Spec:
    """The same instances, tp, dp and routes with the model's tiny variant, on the CPU.

    Weights are held in float32 and KV in float32 (tokens compare with transformers exactly) unless the spec's KV
    is fp8, which CPU units store too (its loss is what such a spec asks to see); "auto"
    transport becomes shm; a role's ``ep`` becomes 1 (the engine runs no expert parallelism yet: every tiny
    unit holds every expert), which `tiny_note` says and this logs.

    Raises:
        LaunchError: the model has no tiny variant.
    """
    model = spec.model if is_tiny(spec.model) else TINY_VARIANT.get(spec.model)
    if model is None:
        raise LaunchError(f"{spec.model} has no tiny variant; tiny variants exist for {sorted(TINY_VARIANT)}")
    provider = "shm" if spec.transport.provider in ("auto", "efa", "verbs") else spec.transport.provider
    note = tiny_note(spec)
    if note:
        log.info(note)
    return attrs.evolve(
        spec, model=model, device="cpu", hardware=attrs.evolve(spec.hardware, gpu="cpu"),
        kv=attrs.evolve(spec.kv, dtype="fp8" if spec.kv.dtype == "fp8" else "float32"),
        transport=attrs.evolve(spec.transport, provider=provider),
        engine=attrs.evolve(spec.engine, dtype="float32"),
        prefill=attrs.evolve(spec.prefill, ep=1), decode=attrs.evolve(spec.decode, ep=1),
    )


def tiny_note(spec: Spec) -> str | None:
    """The one line `--tiny` prints when it runs ``spec``'s expert-parallel roles with ep 1; None when none is."""
    roles = [f"{name}.ep: {role.ep}" for name, role in spec.roles.items() if role.ep > 1]
    return EP_DROPPED_NOTE.format(roles=", ".join(roles)) if roles else None


def check_runnable(spec: Spec) -> None:
    """Refuse a GPU spec, saying what to run instead.

    Without CUDA the spec needs hardware this machine lacks; with CUDA it still cannot run here
    yet: units share their KV pools as host memfd regions, and the cuMem path
    (`disaggsdk.memory.cuda_vmm`) is not wired into them.

    Raises:
        ExpertParallelismUnavailable: a role with ``ep > 1`` (the engine runs no expert parallelism yet) on
            this machine's devices (a GPU spec without CUDA hears first that it needs GPUs).
        LaunchError: ``device: cuda``.
    """
    if spec.device != "cuda":
        _check_ep(spec)
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
    _check_ep(spec)
    raise LaunchError(
        f"{spec.label}: the local runtime runs CPU units only for now (KV pools are host memfd regions, "
        f"CUDA pools are not wired in); add --tiny to run the same topology on the CPU"
    )


def _check_ep(spec: Spec) -> None:
    sharded = [f"{name}.ep: {role.ep}" for name, role in spec.roles.items() if role.ep > 1]
    if sharded:
        raise ExpertParallelismUnavailable(
            f"{spec.label}: {', '.join(sharded)} partitions the routed experts over the ranks, which the engine does "
            f"not run yet (issue 36); run the topology with --tiny (each tiny unit holds every expert), or set ep to "
            f"1 where the ranks' memory allows (`disaggsdk validate` says)")
