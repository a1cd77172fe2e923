"""Request tracing on a real deployment: one prefill and one decode process over shm, behind the HTTP
front end, their spans collected with the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import io
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("opentelemetry.sdk")

import httpx
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.launch._helpers import live_descendants, make_spec

PROMPT = [(j * 7) % 250 + 2 for j in range(30)]  # 29 tokens to prefill: 8 pages of 4, one chunk
CLIENT_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN_ID = "b7ad6b7169203331"


@pytest.fixture(scope="module")
def traced():
    """A tiny P/D deployment that traces every request into an in-memory exporter."""
    from disaggsdk.face.deployment import launch

    exporter = InMemorySpanExporter()
    before = live_descendants()
    d = launch(make_spec("qwen3-coder-tiny", budget=64), port=0, span_exporter=exporter, on_event=lambda _line: None)
    try:
        yield d, exporter
    finally:
        d.shutdown()
    assert live_descendants() <= before


def complete(d, headers: dict[str, str] | None = None) -> str:
    """Send one completion; returns its response id."""
    body = {"model": d.model_name, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    r = httpx.post(f"{d.url}/v1/completions", json=body, headers=headers or {}, timeout=60)
    r.raise_for_status()
    return r.json()["id"]


def spans_of(d, exporter, response_id: str, timeout_s: float = 20.0):
    """The exported spans of the request's trace, once the router, the prefill and the decode unit
    all sent theirs (the prefill unit's may come after the last token)."""
    deadline = time.monotonic() + timeout_s
    while True:
        roots = [s for s in exporter.get_finished_spans() if s.name == "disaggsdk.request"
                 and str(s.attributes["disaggsdk.request_id"]).startswith(response_id)]
        spans = [s for s in exporter.get_finished_spans() if roots and s.context.trace_id == roots[0].context.trace_id]
        roles = {s.resource.attributes["disaggsdk.role"] for s in spans}
        if {"router", "prefill", "decode"} <= roles or time.monotonic() > deadline:
            assert len(roots) == 1, f"{len(roots)} root spans for {response_id}"
            return roots[0], spans
        time.sleep(0.05)


def overlaps(a, b) -> bool:
    return a.start_time < b.end_time and b.start_time < a.end_time


def test_one_trace_across_router_prefill_and_decode_with_layer_transfers_during_compute(traced):
    d, exporter = traced
    rid = complete(d)
    root, spans = spans_of(d, exporter, rid)
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    units = {s.resource.attributes["disaggsdk.unit"]: s.resource.attributes["disaggsdk.role"] for s in spans}
    assert sorted(units.values()) == ["decode", "prefill", "router"], units
    by_id = {s.context.span_id: s for s in spans}
    for s in spans:  # one tree: every span but the root hangs from a span of this trace
        assert s is root or s.parent.span_id in by_id, s.name
    names = {s.name for s in spans}
    assert {"route", "queue", "prefill chunk 0", "context transfer", "kv handoff", "wait for kv (counter)",
            "first step", "decode step"} <= names, names
    compute = {int(s.attributes["layer"]): s for s in spans if s.name.endswith(" compute")}
    transfer = {int(s.attributes["layer"]): s for s in spans if s.name.endswith(" transfer") and "layer" in s.attributes}
    assert len(compute) >= 2 and set(transfer) == set(compute)
    for layer, c in compute.items():
        assert by_id[c.parent.span_id].name == "prefill chunk 0"
        assert transfer[layer].attributes["bytes"] > 0
    # streamed: a layer's writes went while a later layer computed, the first before the forward pass ended
    assert any(overlaps(transfer[i], compute[j]) for i in transfer for j in compute if j > i)
    assert transfer[min(transfer)].start_time < compute[max(compute)].end_time
    assert root.attributes["disaggsdk.prefill_unit"] in units and root.attributes["disaggsdk.finish_reason"] == "length"


def test_a_traceparent_header_puts_the_request_in_the_clients_trace(traced):
    d, exporter = traced
    rid = complete(d, {"traceparent": f"00-{CLIENT_TRACE_ID}-{CLIENT_SPAN_ID}-01"})
    root, spans = spans_of(d, exporter, rid)
    assert format(root.context.trace_id, "032x") == CLIENT_TRACE_ID
    assert format(root.parent.span_id, "016x") == CLIENT_SPAN_ID
    assert {s.resource.attributes["disaggsdk.role"] for s in spans} == {"router", "prefill", "decode"}
    other = complete(d, {"traceparent": "00-not-a-trace-01"})  # invalid: a new trace, served as usual
    root, _ = spans_of(d, exporter, other)
    assert format(root.context.trace_id, "032x") != CLIENT_TRACE_ID and root.parent is None


def test_a_served_requests_spans_come_back_by_its_id_in_process_and_over_http_and_draw_as_a_waterfall(traced):
    pytest.importorskip("matplotlib")
    d, exporter = traced
    rid = complete(d)
    _, exported = spans_of(d, exporter, rid)
    spans = d.trace(rid)
    assert len(spans) == len(exported) and {s.unit for s in spans} >= {"router", "prefill-0", "decode-0"}
    fig = d.waterfall(rid)
    png = io.BytesIO()
    fig.savefig(png, format="png")
    assert png.getvalue().startswith(b"\x89PNG")
    assert d.trace("cmpl-never-sent") == []
    from disaggsdk.face.deployment import fetch_trace

    # from another process's view: the same spans over HTTP
    assert sorted(fetch_trace(d.url, rid), key=lambda s: s.span_id) == sorted(spans, key=lambda s: s.span_id)
    assert fetch_trace(f"{d.url}/v1", "cmpl-never-sent") == []


def test_without_an_exporter_nothing_is_traced_and_units_send_no_spans(monkeypatch):
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.launch import messages as ch
    from disaggsdk.launch.launcher.supervisor import start_local_runtime
    from disaggsdk.serve.routing.router import Router

    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    kinds: list[type] = []

    class Recording(Router):
        def _on_message(self, unit, msg):
            kinds.append(type(msg))
            super()._on_message(unit, msg)

    before = live_descendants()
    spec = make_spec("qwen3-coder-tiny", budget=64)
    with Recording(start_local_runtime(spec, on_event=lambda _line: None)) as rt:
        events = rt.generate_batch([PROMPT], SamplingParams(max_tokens=3, ignore_eos=True), timeout_s=60)
        assert rt.tracing is None and rt.trace(events[0][0].request_id) == []
        time.sleep(0.5)  # a prefill unit's spans would follow its writes' completion
    assert live_descendants() <= before
    assert events[0][-1].finish_reason == "length"
    assert ch.Tokens in kinds or ch.TokensBatch in kinds
    assert ch.RequestSpans not in kinds


def test_without_streaming_each_chunks_transfers_follow_its_forward_pass():
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.serve.backends.local import serve_locally

    exporter = InMemorySpanExporter()
    before = live_descendants()
    spec = make_spec("qwen3-coder-tiny", streaming=False, budget=12)  # 29 tokens to prefill: 3 chunks
    with serve_locally(spec, span_exporter=exporter, on_event=lambda _line: None) as rt:
        events = rt.generate_batch([PROMPT], SamplingParams(max_tokens=2, ignore_eos=True), timeout_s=60)
        assert events[0][-1].finish_reason == "length"
        deadline = time.monotonic() + 20
        while not any(s.name == "prefill prefill-0" for s in exporter.get_finished_spans()):
            assert time.monotonic() < deadline, "the prefill unit sent no spans"
            time.sleep(0.05)
    assert live_descendants() <= before
    spans = exporter.get_finished_spans()
    chunks = {int(s.name.rsplit(" ", 1)[1]): s for s in spans if s.name.startswith("prefill chunk")}
    transfers = [s for s in spans if s.name.startswith("layer ") and s.name.endswith(" transfer")]
    assert sorted(chunks) == [0, 1, 2] and transfers
    assert not any(s.name.endswith(" compute") for s in spans)  # no streamer saw the layers finish
    assert {int(t.attributes["chunk"]) for t in transfers} == set(chunks)
    for t in transfers:  # the ablation: a chunk's writes go once its forward pass is over
        assert t.start_time >= chunks[int(t.attributes["chunk"])].end_time
