"""Each request's phases as OpenTelemetry spans: one trace per request across the router and its units."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from disaggsdk.launch.messages import RequestSpans
from disaggsdk.records.span_records import AttributeValue
from disaggsdk.report.waterfall import TimelineSpan
from disaggsdk.serve.http.client_request_ids import public_names

SERVICE_NAME = "disaggsdk"
ROUTER_UNIT = "router"
MAX_KEPT_TRACES = 256  # requests whose finished spans `RecentTraces` keeps for `spans_of`
# root span contexts kept for units' spans that arrive after their request ended (a prefill unit's
# writes may complete after the decode unit's last token)
MAX_ROOTS = 4096
UNIT_KEY = "disaggsdk.unit"
ROLE_KEY = "disaggsdk.role"
REQUEST_ID_KEY = "disaggsdk.request_id"


class RecentTraces(SpanProcessor):
    """A span processor that keeps the finished spans of the last ``max_traces`` traces in memory."""

    def __init__(self, max_traces: int = MAX_KEPT_TRACES):
        self.max_traces = max_traces
        self._lock = threading.Lock()
        self._traces: OrderedDict[int, list[ReadableSpan]] = OrderedDict()

    def on_end(self, span: ReadableSpan) -> None:
        """Keep ``span`` under its trace; the oldest trace goes once more than ``max_traces`` are held."""
        if span.context is None:
            return
        with self._lock:
            self._traces.setdefault(span.context.trace_id, []).append(span)
            self._traces.move_to_end(span.context.trace_id)
            while len(self._traces) > self.max_traces:
                self._traces.popitem(last=False)

    def spans(self, trace_id: int) -> list[ReadableSpan]:
        """The finished spans of trace ``trace_id`` held now ([] when it is not held)."""
        with self._lock:
            return list(self._traces.get(trace_id, ()))


UNIT_SPANS_WAIT_S = 2.0  # how long `RequestTracing.spans_of` waits for a unit's spans still on their way


class RequestTracing:
    """The router's side of request tracing (see the module doc).

    Args:
        processor: where finished spans go (an exporter's processor); every unit's provider shares it.
        max_kept_traces: how many recent traces `spans_of` can answer for.
    """

    def __init__(self, processor: SpanProcessor, max_kept_traces: int = MAX_KEPT_TRACES):
        self.processor = processor
        self.recent = RecentTraces(max_kept_traces)
        self._lock = threading.Lock()
        self._spans_came = threading.Condition(self._lock)
        self._tracers: dict[str, Tracer] = {}
        self._providers: list[TracerProvider] = []
        self._live: dict[str, Span] = {}  # root spans of requests in flight
        self._roots: OrderedDict[str, SpanContext] = OrderedDict()  # request id -> its root's context
        self._response_ids: dict[str, str] = {}  # request id -> the response id its spans name it by
        self._names: dict[str, str] = {}  # what a client knows a request by -> its request id (the latest)
        # request id -> the units it was handed to whose spans have not come yet (units send a
        # request's spans after its last tokens, so a trace read at once can miss the last unit's)
        self._awaited: dict[str, set[str]] = {}
        self._propagator = TraceContextTextMapPropagator()
        self._router = self._tracer(ROUTER_UNIT, ROUTER_UNIT)

    @classmethod
    def exporting_to(cls, exporter: SpanExporter) -> RequestTracing:
        """Tracing that hands each span to ``exporter`` as it ends, on the thread that ends it (an
        in-memory exporter in a test; for a network exporter prefer `batched`)."""
        return cls(SimpleSpanProcessor(exporter))

    @classmethod
    def batched(cls, exporter: SpanExporter) -> RequestTracing:
        """Tracing that exports spans in batches from a thread of its own (OTLP)."""
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        return cls(BatchSpanProcessor(exporter))

    def _tracer(self, unit: str, role: str) -> Tracer:
        with self._lock:
            tracer = self._tracers.get(unit)
            if tracer is None:
                resource = Resource.create({"service.name": SERVICE_NAME, UNIT_KEY: unit, ROLE_KEY: role})
                provider = TracerProvider(resource=resource, shutdown_on_exit=False)
                provider.add_span_processor(self.recent)
                provider.add_span_processor(self.processor)
                self._providers.append(provider)
                tracer = self._tracers[unit] = provider.get_tracer("disaggsdk")
            return tracer

    # the router's spans

    def start(self, request_id: str, trace_context: Mapping[str, str] | None, num_prompt_tokens: int,
              response_id: str = "") -> bool:
        """Open the request's root span now, under the client's span when ``trace_context`` holds a
        valid ``traceparent``; returns whether it records (False: the client's trace is not sampled,
        and the units need record nothing; or a request under this id is traced already, which the
        router refuses: its trace is left as it is). ``response_id``: the id its client knows it by,
        which names it in its spans and finds its trace (`spans_of`); "" for a caller in this process,
        who knows it by ``request_id``."""
        public_id = response_id or request_id
        parent = self._propagator.extract(dict(trace_context)) if trace_context else Context()
        root = self._router.start_span("disaggsdk.request", context=parent, kind=SpanKind.SERVER,
                                       start_time=time.time_ns(),
                                       attributes={REQUEST_ID_KEY: public_id, "disaggsdk.prompt_tokens": num_prompt_tokens})
        if not root.is_recording():
            return False
        with self._lock:
            if request_id in self._live:
                return False
            self._live[request_id] = root
            self._roots[request_id] = root.get_span_context()
            self._response_ids[request_id] = public_id
            for name in public_names(public_id):
                self._names[name] = request_id
            self._awaited[request_id] = set()
            while len(self._roots) > MAX_ROOTS:
                self._forget(self._roots.popitem(last=False)[0])
        return True

    def _forget(self, request_id: str) -> None:
        """Drop what is kept of an old request whose root went (under the lock)."""
        self._awaited.pop(request_id, None)
        for name in public_names(self._response_ids.pop(request_id, request_id)):
            if self._names.get(name) == request_id:  # a later request under the same name keeps it
                del self._names[name]

    def routed(self, request_id: str, unit: str, start_ns: int, end_ns: int) -> None:
        """The router chose ``unit`` for the request between ``start_ns`` and ``end_ns``."""
        root = self._live.get(request_id)
        if root is None:
            return
        root.set_attribute("disaggsdk.decode_unit", unit)
        self._await(request_id, unit)
        span = self._router.start_span("route", context=trace.set_span_in_context(root), start_time=start_ns,
                                       attributes={UNIT_KEY + "_chosen": unit})
        span.end(end_time=end_ns)

    def first_token(self, request_id: str, unit: str, prefill_unit: str) -> None:
        """The request's first token reached the router now."""
        root = self._live.get(request_id)
        if root is None:
            return
        root.add_event("first token", timestamp=time.time_ns())
        if prefill_unit:
            root.set_attribute("disaggsdk.prefill_unit", prefill_unit)
            self._await(request_id, prefill_unit)

    def finish(self, request_id: str, finish_reason: str | None, error: str | None = None) -> None:
        """End the request's root span now."""
        with self._lock:
            root = self._live.pop(request_id, None)
        if root is None:
            return
        root.set_attribute("disaggsdk.finish_reason", finish_reason or "")
        if error:
            root.set_status(trace.Status(trace.StatusCode.ERROR, error))
        root.end(end_time=time.time_ns())

    # the units' spans

    def unit_spans(self, msg: RequestSpans) -> None:
        """A unit's records of a traced request, as spans under its root (dropped when the root is
        no longer known: more than `MAX_ROOTS` requests ago)."""
        rec = msg.record
        with self._lock:
            root = self._roots.get(rec.request_id)
            public_id = self._response_ids.get(rec.request_id, rec.request_id)
        if root is None:
            return
        try:
            self._span_of_unit(msg, root, public_id)
        finally:
            with self._spans_came:
                self._awaited.get(rec.request_id, set()).discard(msg.unit)
                self._spans_came.notify_all()

    def _await(self, request_id: str, unit: str) -> None:
        with self._lock:
            if request_id in self._awaited:
                self._awaited[request_id].add(unit)

    def _span_of_unit(self, msg: RequestSpans, root: SpanContext, public_id: str) -> None:
        rec = msg.record
        tracer = self._tracer(msg.unit, msg.role)
        unit_span = tracer.start_span(f"{msg.role} {msg.unit}", context=trace.set_span_in_context(NonRecordingSpan(root)),
                                      start_time=rec.start_ns,
                                      attributes={UNIT_KEY: msg.unit, ROLE_KEY: msg.role, REQUEST_ID_KEY: public_id})
        opened: list[Span] = []
        for s in rec.spans:
            parent = opened[s.parent] if 0 <= s.parent < len(opened) else unit_span
            opened.append(tracer.start_span(s.name, context=trace.set_span_in_context(parent), start_time=s.start_ns,
                                            attributes=dict(s.attributes)))
        for span, s in zip(opened, rec.spans):
            span.end(end_time=s.end_ns)
        unit_span.end(end_time=rec.end_ns)

    # reading back

    def spans_of(self, public_id: str, wait_s: float = UNIT_SPANS_WAIT_S) -> list[ReadableSpan]:
        """The finished spans of a recent request's trace, found by exactly what its client knows it by:
        the response id ("cmpl-...") or the X-Request-Id its answer carried (the latest request under
        it); a request started here without a response id, by its request id. A prefix or a part of an
        id finds nothing, nor does the request id of a request that has a response id. [] when not
        held. Waits up to ``wait_s`` for the spans of every unit the request was handed to: a unit
        sends them after the request's last tokens, so a trace read as soon as the response ends
        could miss them."""
        deadline = time.monotonic() + wait_s
        with self._spans_came:
            rid = self._names.get(public_id)
            if rid is None or rid not in self._roots:
                return []
            root = self._roots[rid]
            while self._awaited.get(rid) and (left := deadline - time.monotonic()) > 0:
                self._spans_came.wait(left)
        return self.recent.spans(root.trace_id)

    def close(self) -> None:
        """Export what is left and stop the exporter."""
        self.processor.force_flush()
        self.processor.shutdown()


def timeline_spans(spans: Sequence[ReadableSpan]) -> list[TimelineSpan]:
    """OpenTelemetry spans (from `RequestTracing.spans_of` or an in-memory exporter) as the
    waterfall's `TimelineSpan`s, each named by the unit its resource names."""
    out = []
    for s in spans:
        if s.context is None or s.start_time is None or s.end_time is None:
            continue
        unit = s.resource.attributes.get(UNIT_KEY, ROUTER_UNIT)
        attributes: dict[str, AttributeValue] = {k: v for k, v in (s.attributes or {}).items()
                                                 if isinstance(v, (str, int, float))}
        out.append(TimelineSpan(s.name, str(unit), s.start_time, s.end_time, format(s.context.span_id, "016x"),
                                format(s.parent.span_id, "016x") if s.parent is not None else None, attributes))
    return out
