"""Whether requests are traced, and where their spans go: decided once, when the router starts.

Off unless one of these says otherwise, first one wins: a span exporter handed in
(``launch(spec, span_exporter=...)``), the spec's ``$.serve.otlp_traces_endpoint`` (OTLP over HTTP to
that URL), the standard ``OTEL_TRACES_EXPORTER`` environment variable (``otlp``: OTLP over HTTP to
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT`` as the SDK reads them;
``console``: printed; ``none``: off). Off, nothing of opentelemetry is imported and no unit records
a thing (`serve.tracing.request_tracing`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from disaggsdk.serve.tracing.request_tracing import RequestTracing
    from disaggsdk.spec.serving import Serve

EXPORTER_ENV = "OTEL_TRACES_EXPORTER"
ENV_EXPORTERS = ("otlp", "console", "none")


class TracingUnavailableError(DisaggError):
    """Tracing was asked for but cannot run here (the ``trace`` extra is missing, or an unknown exporter)."""


def request_tracing_for(serve: Serve, span_exporter: SpanExporter | None = None,
                        environ: Mapping[str, str] | None = None) -> RequestTracing | None:
    """The router's tracing for this deployment, or None when tracing is off (see the module doc).

    Args:
        serve: the spec's serve section (``otlp_traces_endpoint``).
        span_exporter: an OpenTelemetry ``SpanExporter`` to hand every span to as it ends (e.g. the
            SDK's ``InMemorySpanExporter``); it wins over the spec and the environment.
        environ: the environment to read (default: this process's).
    Raises:
        TracingUnavailableError: tracing is asked for but opentelemetry is not installed, or
            ``OTEL_TRACES_EXPORTER`` names an exporter other than otlp, console or none.
    """
    env = os.environ if environ is None else environ
    from_env = env.get(EXPORTER_ENV, "none").strip().lower() or "none"
    if span_exporter is None and serve.otlp_traces_endpoint is None and from_env == "none":
        return None
    if span_exporter is None and serve.otlp_traces_endpoint is None and from_env not in ENV_EXPORTERS:
        raise TracingUnavailableError(f"{EXPORTER_ENV}={from_env!r}: disaggsdk exports traces with "
                                      f"{', '.join(ENV_EXPORTERS)}; set one of those or unset it")
    try:
        from disaggsdk.serve.tracing.request_tracing import RequestTracing
    except ImportError as exc:
        raise TracingUnavailableError(f"request tracing needs opentelemetry ({exc}); "
                                      "install it with `pip install 'disaggsdk[trace]'`") from None
    if span_exporter is not None:
        return RequestTracing.exporting_to(span_exporter)
    if serve.otlp_traces_endpoint is not None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return RequestTracing.batched(OTLPSpanExporter(endpoint=serve.otlp_traces_endpoint))
    if from_env == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return RequestTracing.batched(ConsoleSpanExporter())
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return RequestTracing.batched(OTLPSpanExporter())
