"""`serve_locally`: a spec's units as local processes, served by a `Router` — one call.

What `disaggsdk launch`, `disaggsdk generate --spec`, the benchmarks and the tests start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disaggsdk.serve.router import Router

if TYPE_CHECKING:
    from disaggsdk.spec import Spec


def serve_locally(spec: Spec, **runtime_options: Any) -> Router:  # options: the runtime's keywords, as they are
    """Start ``spec``'s units with `disaggsdk.launch.LocalRuntime` and route requests to them.

    Args:
        spec: a checked `Spec`.
        runtime_options: `LocalRuntime`'s keyword arguments (``tiny``, ``colocated``,
            ``cpu_affinity``, ``log_dir``, ``provider``, ``secret``, ...).
    Returns:
        The router (a `ServingBackend`); closing it stops every unit.
    Raises:
        LaunchError: the units could not start (with the failing unit's log tail).
    """
    if spec.launch.backend == "ray":
        from disaggsdk.launch.ray_runtime import RayRuntime

        runtime = RayRuntime(spec, address=spec.launch.address, **runtime_options)
    else:
        from disaggsdk.launch.runtime import LocalRuntime

        runtime = LocalRuntime(spec, **runtime_options)
    try:
        return Router(runtime)
    except BaseException:
        runtime.close()
        raise
