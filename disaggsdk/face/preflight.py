"""What a spec needs from this machine before `launch` starts anything, and where the runtime is.

A GPU spec on a machine without CUDA fails here, with the hardware it needs and what to run
instead, rather than deep inside a rank process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.spec.types import Spec


class HardwareError(DisaggError):
    """The spec needs hardware this machine does not have."""


class LaunchUnavailableError(DisaggError):
    """This installation has no local runtime to start a deployment's processes."""


def gpus_needed(spec: Spec) -> int:
    """Devices the spec's instances use in all (every rank of every instance)."""
    return sum(role.replicas * role.tp * role.dp for role in (spec.prefill, spec.decode))


def cuda_available() -> bool:
    """Whether torch sees a CUDA device (imports torch)."""
    import torch

    return torch.cuda.is_available()


def check_hardware(spec: Spec, tiny: bool, has_cuda: bool | None = None) -> None:
    """Refuse a CUDA spec on a machine without GPUs unless it runs with the tiny model on CPU.

    Args:
        spec: the deployment.
        tiny: the caller asked for the tiny variant on CPU (``--tiny``).
        has_cuda: whether CUDA is present; looked up when None.
    Raises:
        HardwareError: saying what the spec needs and what to run instead.
    """
    if spec.device != "cuda" or tiny:
        return
    if has_cuda is None:
        has_cuda = cuda_available()
    if has_cuda:
        return
    hw = spec.hardware
    raise HardwareError(
        f"{spec.label} needs CUDA GPUs: {gpus_needed(spec)} x {hw.gpu} ({hw.gpus_per_node} per node, "
        f"{hw.nics_per_node} NICs of {hw.nic_gbps:g} Gb/s) for prefill {spec.prefill.replicas} x tp{spec.prefill.tp}"
        f"{f' dp{spec.prefill.dp}' if spec.prefill.dp > 1 else ''} and decode {spec.decode.replicas} x "
        f"tp{spec.decode.tp}{f' dp{spec.decode.dp}' if spec.decode.dp > 1 else ''}; this machine has none.\n"
        f"Run the same topology with the tiny model on CPU: add --tiny (Python: launch(tiny=True)); "
        f"or estimate it at scale with `disaggsdk simulate`."
    )


def local_runtime() -> Any:
    """`disaggsdk.serve.local.serve_locally`: starts a spec's units here and routes to them.

    Raises:
        LaunchUnavailableError: the local runtime is not part of this installation.
    """
    try:
        from disaggsdk.launch import LocalRuntime  # noqa: F401 - the part a trimmed build lacks
        from disaggsdk.serve.local import serve_locally
    except ImportError as exc:
        if not (exc.name or "").startswith("disaggsdk.launch") and "LocalRuntime" not in str(exc):
            raise
        raise LaunchUnavailableError(
            "this build has no local runtime (disaggsdk.launch.LocalRuntime), so a spec cannot be launched yet; "
            "serve one colocated engine instead: `disaggsdk serve --model qwen3-coder-tiny`"
        ) from None
    return serve_locally
