"""Where the local runtime is, before `launch` starts anything.

A `device: cuda` spec is not refused here on a machine without CUDA: its units start and each
says so at its first CUDA call, before it loads a weight (`launch.cuda_devices.require_cuda`),
so the path a GPU node takes is the one tested on the CPU.
"""

from __future__ import annotations

from typing import Any

from disaggsdk.errors import DisaggError


class LaunchUnavailableError(DisaggError):
    """This installation has no local runtime to start a deployment's processes."""


def local_runtime() -> Any:
    """`disaggsdk.serve.local.serve_locally`: starts a spec's units here and routes to them.

    Raises:
        LaunchUnavailableError: the local runtime is not part of this installation.
    """
    try:
        from disaggsdk.launch import start_local_runtime  # noqa: F401 - the part a trimmed build lacks
        from disaggsdk.serve.local import serve_locally
    except ImportError as exc:
        if not (exc.name or "").startswith("disaggsdk.launch") and "start_local_runtime" not in str(exc):
            raise
        raise LaunchUnavailableError(
            "this build has no local runtime (disaggsdk.launch.start_local_runtime), so a spec cannot be launched yet; "
            "serve one colocated engine instead: `disaggsdk serve --model qwen3-coder-tiny`"
        ) from None
    return serve_locally
