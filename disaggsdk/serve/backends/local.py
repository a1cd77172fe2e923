"""`serve_locally`: a spec's units as local processes, served by a `Router` — one call.

What `disaggsdk launch`, `disaggsdk generate --spec`, the benchmarks and the tests start.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict, Unpack

from disaggsdk.serve.routing.router import Router

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from disaggsdk.launch.launcher.units import CpuAffinity
    from disaggsdk.spec import Spec


class RuntimeOptions(TypedDict, total=False):
    """The keywords `start_local_runtime` and `start_ray_runtime` share (see `launch.launcher.supervisor.Supervisor`)."""

    tiny: bool
    colocated: bool
    cpu_affinity: CpuAffinity
    log_dir: str | None
    provider: str | None
    start_timeout_s: float
    on_event: Callable[[str], None] | None
    on_progress: Callable[[str], None] | None
    secret: bytes | None
    max_restarts: int
    restart_window_s: float


def serve_locally(spec: Spec, span_exporter: SpanExporter | None = None,
                  **runtime_options: Unpack[RuntimeOptions]) -> Router:
    """Start ``spec``'s units with `disaggsdk.launch.start_local_runtime` and route requests to them.

    Args:
        spec: a checked `Spec`.
        span_exporter: trace every request and hand its spans to this OpenTelemetry exporter
            (`serve.tracing.tracing_switch`); None: as ``serve.otlp_traces_endpoint`` and the environment say.
        runtime_options: `start_local_runtime`'s keyword arguments (``tiny``, ``colocated``,
            ``cpu_affinity``, ``log_dir``, ``provider``, ``secret``, ...).
    Returns:
        The router (a `ServingBackend`); closing it stops every unit.
    Raises:
        LaunchError: the units could not start (with the failing unit's log tail).
        TracingUnavailableError: tracing is asked for but cannot run (checked before any unit starts).
    """
    from disaggsdk.serve.tracing.tracing_switch import request_tracing_for

    tracing = request_tracing_for(spec.serve, span_exporter)
    runtime = None
    try:
        if spec.launch.backend == "ray":
            from disaggsdk.launch.launcher.supervisor import start_ray_runtime

            runtime = start_ray_runtime(spec, address=spec.launch.address, **runtime_options)
        else:
            from disaggsdk.launch.launcher.supervisor import start_local_runtime

            runtime = start_local_runtime(spec, **runtime_options)
        return Router(runtime, tracing)
    except BaseException:
        if runtime is not None:
            runtime.close()
        if tracing is not None:  # its exporter's thread, if it has one
            tracing.close()
        raise
