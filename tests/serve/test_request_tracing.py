"""Request tracing without processes: the units' span records, their conversion to OpenTelemetry spans
under the request's root, the W3C trace context, the switch, and the waterfall drawn from them."""

from __future__ import annotations

import time
from concurrent.futures import Future

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("msgspec")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from disaggsdk.launch.messages import FROM_UNIT, RequestSpans
from disaggsdk.messenger.span_log import SpanLog
from disaggsdk.records.span_records import RequestSpanRecords, SpanRecord, epoch_ns
from disaggsdk.report.waterfall import TimelineSpan, span_rows, waterfall
from disaggsdk.serve.tracing.request_tracing import RequestTracing, timeline_spans
from disaggsdk.serve.tracing.tracing_switch import TracingUnavailableError, request_tracing_for
from disaggsdk.spec.serving import Serve

CLIENT_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"


def prefill_record(request_id: str, t0: int) -> RequestSpanRecords:
    """A prefill unit's record: a chunk of two layers, each layer's transfer starting as it is done."""
    ms = 1_000_000
    log = SpanLog(request_id, t0)
    log.add("queue", t0, t0 + 1 * ms)
    chunk = log.open("prefill chunk 0", t0 + 1 * ms, num_tokens=29)
    log.add("layer 0 compute", t0 + 1 * ms, t0 + 3 * ms, chunk, layer=0)
    log.add("layer 0 transfer", t0 + 3 * ms, t0 + 4 * ms, layer=0, bytes=4096)
    log.add("layer 1 compute", t0 + 3 * ms, t0 + 5 * ms, chunk, layer=1)
    log.add("layer 1 transfer", t0 + 5 * ms, t0 + 6 * ms, layer=1, bytes=4096)
    log.close(chunk, t0 + 5 * ms)
    return log.finish(t0 + 6 * ms)


# the records


def test_a_span_log_closes_spans_when_their_writes_complete_and_ends_what_is_left_open():
    log = SpanLog("r", 100)
    outer = log.open("chunk", 100)
    inner = log.add("layer 0 compute", 110, 120, outer, layer=0)
    done, pending = Future(), Future()
    sent = log.open("layer 0 transfer", 120, bytes=10)
    log.close_when_done(sent, [done])
    never = log.open("context transfer", 130)
    log.close_when_done(never, [pending])
    done.set_result(None)
    log.close(outer, 150, num_tokens=3)
    log.close(outer, 999)  # a second close keeps the first end
    record = log.finish(200)
    by_name = {s.name: s for s in record.spans}
    assert by_name["chunk"].end_ns == 150 and by_name["chunk"].attributes == {"num_tokens": 3}
    assert record.spans[inner].parent == outer
    assert 120 < by_name["layer 0 transfer"].end_ns <= time.time_ns()
    assert by_name["context transfer"].end_ns == 200  # its write never completed: it ends with the record
    assert (record.start_ns, record.end_ns) == (100, 200)


def test_extending_a_log_shifts_the_parents_of_the_spans_it_takes():
    log = SpanLog("r", 0)
    log.add("arrival", 0, 1)
    log.extend([SpanRecord("kv handoff", 1, 9), SpanRecord("admit", 8, 9, 0)])
    spans = log.finish(10).spans
    assert [(s.name, s.parent) for s in spans] == [("arrival", -1), ("kv handoff", -1), ("admit", 1)]


def test_a_request_spans_frame_survives_the_channel_codec():
    import msgspec

    frame = RequestSpans("prefill-0", "prefill", prefill_record("r", 10**18))
    assert FROM_UNIT.decode(msgspec.msgpack.encode(frame)) == frame


def test_a_monotonic_reading_becomes_epoch_ns_with_the_callers_offset():
    offset_ns = time.time_ns() - time.monotonic_ns()
    assert abs(epoch_ns(time.monotonic(), offset_ns) - time.time_ns()) < 50_000_000


# the router's conversion


def traced_request(tracing: RequestTracing, request_id: str, trace_context: dict[str, str] | None = None,
                   response_id: str = "") -> None:
    assert tracing.start(request_id, trace_context, 30, response_id)
    now = time.time_ns()
    tracing.routed(request_id, "decode-0", now, now + 1000)
    tracing.unit_spans(RequestSpans("prefill-0", "prefill", prefill_record(request_id, now)))
    tracing.first_token(request_id, "decode-0", "prefill-0")
    tracing.finish(request_id, "length")
    decode = RequestSpanRecords(request_id, now, now + 9_000_000, [SpanRecord("first step", now + 7_000_000,
                                                                               now + 8_000_000, -1, {"batch_size": 1})])
    tracing.unit_spans(RequestSpans("decode-0", "decode", decode))  # after its request ended: still in its trace


def test_unit_records_become_spans_of_one_trace_under_the_request_root():
    exporter = InMemorySpanExporter()
    tracing = RequestTracing.exporting_to(exporter)
    traced_request(tracing, "req-1")
    spans = exporter.get_finished_spans()
    by_name = {s.name: s for s in spans}
    assert len({s.context.trace_id for s in spans}) == 1
    root = by_name["disaggsdk.request"]
    assert root.parent is None and root.attributes["disaggsdk.finish_reason"] == "length"
    assert by_name["prefill prefill-0"].parent.span_id == root.context.span_id
    assert by_name["layer 1 compute"].parent.span_id == by_name["prefill chunk 0"].context.span_id
    assert by_name["layer 1 transfer"].parent.span_id == by_name["prefill prefill-0"].context.span_id
    assert by_name["first step"].parent.span_id == by_name["decode decode-0"].context.span_id
    units = {s.name: s.resource.attributes["disaggsdk.unit"] for s in spans}
    assert units["layer 0 compute"] == "prefill-0" and units["first step"] == "decode-0"
    assert units["route"] == "router" and {s.resource.attributes["service.name"] for s in spans} == {"disaggsdk"}
    assert by_name["layer 0 transfer"].attributes["bytes"] == 4096
    assert by_name["layer 0 transfer"].end_time - by_name["layer 0 transfer"].start_time == 1_000_000
    # kept in memory: by the router's id, which is what a caller in this process knows it by
    assert {s.name for s in tracing.spans_of("req-1")} == set(by_name)
    tracing.close()


def test_a_trace_read_as_the_response_ends_waits_for_the_last_units_spans_and_no_longer():
    """A unit sends a request's spans after its last tokens: reading the trace at once waits for the
    decode unit's (sent 0.3 s later here); a unit that never sends them costs `wait_s`, no more."""
    import threading

    tracing = RequestTracing.exporting_to(InMemorySpanExporter())
    now = time.time_ns()
    assert tracing.start("req-3", None, 30)
    tracing.routed("req-3", "decode-0", now, now + 1000)
    tracing.unit_spans(RequestSpans("prefill-0", "prefill", prefill_record("req-3", now)))
    tracing.first_token("req-3", "decode-0", "prefill-0")
    tracing.finish("req-3", "length")
    decode = RequestSpanRecords("req-3", now, now + 9_000_000, [SpanRecord("first step", now + 1, now + 2, -1, {})])
    late = threading.Timer(0.3, tracing.unit_spans, [RequestSpans("decode-0", "decode", decode)])
    late.start()
    try:
        assert "first step" in {s.name for s in tracing.spans_of("req-3", wait_s=10.0)}
    finally:
        late.cancel()
    assert tracing.start("req-4", None, 30)
    tracing.routed("req-4", "decode-1", now, now + 1000)
    tracing.finish("req-4", "abort")  # decode-1 died: its spans never come
    start = time.monotonic()
    assert {s.name for s in tracing.spans_of("req-4", wait_s=0.2)} == {"disaggsdk.request", "route"}
    assert 0.2 <= time.monotonic() - start < 2.0
    tracing.close()


def test_a_valid_traceparent_continues_the_clients_trace_and_an_invalid_one_starts_a_new_one():
    exporter = InMemorySpanExporter()
    tracing = RequestTracing.exporting_to(exporter)
    traced_request(tracing, "cmpl-a-0f", {"traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"}, "cmpl-a")
    traced_request(tracing, "cmpl-b", {"traceparent": f"00-{CLIENT_TRACE_ID}-zz-01"})
    a, b = tracing.spans_of("cmpl-a"), tracing.spans_of("cmpl-b")
    assert tracing.spans_of("cmpl-a-0f") == []  # a request's key, when it has a response id, names no trace
    root_a = next(s for s in a if s.name == "disaggsdk.request")
    assert format(root_a.context.trace_id, "032x") == CLIENT_TRACE_ID
    assert format(root_a.parent.span_id, "016x") == CLIENT_SPAN_ID and root_a.parent.is_remote
    assert {s.context.trace_id for s in a} == {root_a.context.trace_id}
    root_b = next(s for s in b if s.name == "disaggsdk.request")
    assert format(root_b.context.trace_id, "032x") != CLIENT_TRACE_ID and root_b.parent is None
    tracing.close()


def test_a_trace_is_found_by_the_latest_request_under_a_name_and_forgotten_with_its_root(monkeypatch):
    import disaggsdk.serve.tracing.request_tracing as request_tracing

    monkeypatch.setattr(request_tracing, "MAX_ROOTS", 2)
    tracing = RequestTracing.exporting_to(InMemorySpanExporter())
    traced_request(tracing, "cmpl-x-01", response_id="cmpl-x")
    traced_request(tracing, "cmpl-x-02", response_id="cmpl-x")  # the same X-Request-Id, sent again later
    root = next(s for s in tracing.spans_of("x", wait_s=0) if s.name == "disaggsdk.request")
    assert root.attributes["disaggsdk.request_id"] == "cmpl-x"  # its key is in no span
    assert {s.context.trace_id for s in tracing.spans_of("cmpl-x", wait_s=0)} == {root.context.trace_id}
    traced_request(tracing, "cmpl-y-03", response_id="cmpl-y")  # the first root goes: the name stays the latest's
    assert {s.context.trace_id for s in tracing.spans_of("cmpl-x", wait_s=0)} == {root.context.trace_id}
    traced_request(tracing, "cmpl-z-04", response_id="cmpl-z")  # and now the latest's goes too
    assert tracing.spans_of("cmpl-x", wait_s=0) == [] and tracing.spans_of("x", wait_s=0) == []
    tracing.close()


def test_a_client_trace_that_is_not_sampled_is_not_recorded():
    tracing = RequestTracing.exporting_to(InMemorySpanExporter())
    assert not tracing.start("r", {"traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-00"}, 3)
    tracing.close()


def test_a_duplicate_request_id_leaves_the_trace_of_the_request_holding_it():
    exporter = InMemorySpanExporter()
    tracing = RequestTracing.exporting_to(exporter)
    assert tracing.start("r", None, 3)
    assert not tracing.start("r", None, 3)
    tracing.finish("r", "stop")
    assert [s.name for s in exporter.get_finished_spans()] == ["disaggsdk.request"]
    tracing.close()


# the switch


def test_tracing_is_off_unless_an_exporter_the_spec_or_the_environment_says_so():
    assert request_tracing_for(Serve(), environ={}) is None
    assert request_tracing_for(Serve(), environ={"OTEL_TRACES_EXPORTER": "none"}) is None
    for tracing in (request_tracing_for(Serve(), InMemorySpanExporter(), environ={}),
                    request_tracing_for(Serve(), environ={"OTEL_TRACES_EXPORTER": "console"}),
                    request_tracing_for(Serve(otlp_traces_endpoint="http://127.0.0.1:9/v1/traces"), environ={})):
        assert isinstance(tracing, RequestTracing)
        tracing.close()
    with pytest.raises(TracingUnavailableError, match="OTEL_TRACES_EXPORTER='zipkin'"):
        request_tracing_for(Serve(), environ={"OTEL_TRACES_EXPORTER": "zipkin"})


def test_the_spec_endpoint_gets_the_spans_over_otlp_http():
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    posts: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self):
            posts.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
        tracing = request_tracing_for(Serve(otlp_traces_endpoint=url), environ={})
        traced_request(tracing, "req-otlp")
        tracing.close()  # flushes the batch
    finally:
        server.shutdown()
        server.server_close()
    assert posts and {path for path, _ in posts} == {"/v1/traces"}
    exported = {}
    for _, body in posts:
        request = ExportTraceServiceRequest.FromString(body)
        for resource_spans in request.resource_spans:
            unit = next(a.value.string_value for a in resource_spans.resource.attributes if a.key == "disaggsdk.unit")
            for scope in resource_spans.scope_spans:
                exported.update({span.name: unit for span in scope.spans})
    assert exported["layer 0 transfer"] == "prefill-0" and exported["disaggsdk.request"] == "router"


def test_the_spec_key_takes_only_an_http_url():
    with pytest.raises(ValueError, match="otlp_traces_endpoint: must be an http:// or https:// URL"):
        Serve(otlp_traces_endpoint="localhost:4318")
    assert Serve(otlp_traces_endpoint="https://otel.example:4318/v1/traces").otlp_traces_endpoint.startswith("https")


# the waterfall


def test_waterfall_rows_put_each_span_under_its_parent_in_start_order():
    spans = [TimelineSpan("b", "u", 5, 6, "2", "1"), TimelineSpan("root", "router", 0, 10, "1"),
             TimelineSpan("a", "u", 2, 3, "3", "1"), TimelineSpan("a.1", "u", 2, 3, "4", "3"),
             TimelineSpan("orphan", "u", 1, 2, "5", "gone")]
    assert [(s.name, d) for s, d in span_rows(spans)] == [("root", 0), ("a", 1), ("a.1", 2), ("b", 1), ("orphan", 0)]


def test_the_waterfall_of_converted_spans_renders():
    pytest.importorskip("matplotlib")
    exporter = InMemorySpanExporter()
    tracing = RequestTracing.exporting_to(exporter)
    traced_request(tracing, "req-1")
    spans = timeline_spans(exporter.get_finished_spans())
    fig = waterfall(spans, title="req-1")
    labels = [t.get_text().strip() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "disaggsdk.request" and "layer 1 transfer" in labels and len(labels) == len(spans)
    import io

    png = io.BytesIO()
    fig.savefig(png, format="png")
    assert png.getvalue().startswith(b"\x89PNG")
    with pytest.raises(ValueError, match="no spans"):
        waterfall([])
    tracing.close()
