"""`serve_locally`: a spec's units as local processes, served by a `Router` — one call; `serve_runtime`:
the same around any way to start the units (`launch.launcher.supervisor.start_runtime` follows the
spec's ``$.launch.backend``: what `disaggsdk launch`, `disaggsdk generate --spec` and the benchmarks start).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Unpack

from disaggsdk.serve.routing.router import Router

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from disaggsdk.launch.launcher.supervisor import RuntimeOptions, StartRuntime
    from disaggsdk.spec import Spec


def serve_locally(spec: Spec, span_exporter: SpanExporter | None = None,
                  **runtime_options: Unpack[RuntimeOptions]) -> Router:
    """Start ``spec``'s units with `disaggsdk.launch.start_local_runtime` and route requests to them
    (`serve_runtime`; whatever its ``$.launch.backend`` says: `serve_runtime` with
    `launch.launcher.supervisor.start_runtime` follows it).

    Args:
        spec: a checked `Spec`.
        span_exporter: trace every request and hand its spans to this OpenTelemetry exporter
            (`serve.tracing.tracing_switch`); None: as ``$.serve.otlp_traces_endpoint`` and the environment say.
        runtime_options: `start_local_runtime`'s keyword arguments (``tiny``, ``colocated``,
            ``cpu_affinity``, ``log_dir``, ``provider``, ``secret``, ...).
    Returns:
        The router (a `ServingBackend`); closing it stops every unit.
    Raises:
        LaunchError: the units could not start (with the failing unit's log tail).
        TracingUnavailableError: tracing is asked for but cannot run (checked before any unit starts).
    """
    from disaggsdk.launch.launcher.supervisor import start_local_runtime

    return serve_runtime(spec, start_local_runtime, span_exporter, **runtime_options)


def serve_runtime(spec: Spec, start: StartRuntime, span_exporter: SpanExporter | None = None,
                  **runtime_options: Unpack[RuntimeOptions]) -> Router:
    """Route requests to the units ``start(spec, **runtime_options)`` starts, tracing them as
    ``spec.serve`` (or ``span_exporter``) says; the tracing is checked before any unit starts.

    Args:
        spec: a checked `Spec`.
        start: starts the units and returns them started: `start_local_runtime`, `start_ray_runtime`,
            or `launch.launcher.supervisor.start_runtime` (the one ``spec.launch.backend`` names).
        span_exporter: as for `serve_locally`.
        runtime_options: ``start``'s keyword arguments.
    Returns:
        The router (a `ServingBackend`); closing it stops every unit.
    Raises:
        LaunchError: the units could not start (with the failing unit's log tail).
        TracingUnavailableError: tracing is asked for but cannot run.
    """
    from disaggsdk.serve.tracing.tracing_switch import request_tracing_for

    tracing = request_tracing_for(spec.serve, span_exporter)
    runtime = None
    try:
        runtime = start(spec, **runtime_options)
        return Router(runtime, tracing)
    except BaseException:
        if runtime is not None:
            runtime.close()
        if tracing is not None:  # its exporter's thread, if it has one
            tracing.close()
        raise
