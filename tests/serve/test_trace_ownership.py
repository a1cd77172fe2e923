"""A trace is read by exactly the id its client got or sent, and the request's internal key never
leaves the server (issue 55 finding 4: ``GET /traces/cmpl`` gave the newest completion of any client,
``/traces/cmpl-alice`` another client's trace by part of its X-Request-Id, and traces and the move
answer showed the internal key). Over real HTTP, against a router whose fake units answer at once."""

from __future__ import annotations

import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.launch import messages as ch
from disaggsdk.records.span_records import RequestSpanRecords, SpanRecord
from disaggsdk.serve.http.client_request_ids import internal_request_id
from disaggsdk.serve.http.http_server import HttpServer
from disaggsdk.serve.http.openai_app import build_app
from disaggsdk.serve.metrics import ServerMetrics
from disaggsdk.serve.routing.router import Router
from disaggsdk.serve.tracing.request_tracing import RequestTracing
from tests.serve.test_router import FakeRuntime

KEY = "operator-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
HELD = 99  # max_tokens of a request the fake units keep decoding (one token so far), to be moved
SILENT = 98  # max_tokens of a request the fake units never answer (no token yet)
REFUSED = 97  # max_tokens of a request a unit refuses, naming it by the only id it knows: its key


class AnsweringRuntime(FakeRuntime):
    """Fake units that answer each request at once with two tokens and the decode unit's spans (or as
    `HELD`, `SILENT`, `REFUSED` say), and carry out every move asked of them."""

    def send(self, unit, message):
        if not super().send(unit, message):
            return False
        if isinstance(message, ch.Generate):
            rid, max_tokens = message.request_id, message.params.max_tokens
            if max_tokens == SILENT:
                return True
            if max_tokens == REFUSED:
                self.on_message(unit, ch.Tokens(rid, [], True, "error", error=f"{rid}: token ids outside the vocabulary"))
                return True
            held = max_tokens == HELD
            self.on_message(unit, ch.Tokens(rid, [7] if held else [7, 8], not held, None if held else "length"))
            if not held:
                now = time.time_ns()
                record = RequestSpanRecords(rid, now, now + 1000, [SpanRecord("first step", now, now + 500, -1, {})])
                self.on_message(unit, ch.RequestSpans(unit, "decode", record))
        elif isinstance(message, ch.MoveRequest):
            rid, target = message.request_id, message.target
            self.on_message(target, ch.RequestMovedIn(rid, unit, num_output_tokens=1, num_bytes=4096))
            self.on_message(unit, ch.RequestMoveEnded(rid, target, moved=True))
            self.on_message(target, ch.Tokens(rid, [9], True, "length"))
        return True


@pytest.fixture(scope="module")
def served():
    """A router over fake units, tracing into memory, behind the HTTP front end with an API key."""
    runtime = AnsweringRuntime({"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"})
    router = Router(runtime, tracing=RequestTracing.exporting_to(InMemorySpanExporter()))
    http = HttpServer(build_app(router, ServerMetrics(router.stats, router.model_name), api_key=KEY)).start()
    try:
        yield router, runtime, http.url
    finally:
        http.stop()
        router.close()


def complete(url: str, client_id: str | None = None, chat: bool = False) -> str:
    """Send one request (with ``client_id`` as its X-Request-Id); returns its response id."""
    headers = AUTH | ({"X-Request-Id": client_id} if client_id else {})
    body = ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2} if chat
            else {"prompt": [5, 6, 7], "max_tokens": 2})
    r = httpx.post(f"{url}/v1/{'chat/' if chat else ''}completions", json=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["id"]


def key_of(runtime: AnsweringRuntime, response_id: str) -> str:
    """The internal key the units got for a response (what the client must never see)."""
    keys = [m.request_id for _, m in runtime.sent if isinstance(m, ch.Generate)
            and (m.request_id == response_id or m.request_id.startswith(response_id + "-"))]
    assert len(keys) == 1, keys
    return keys[0]


def trace(url: str, request_id: str) -> httpx.Response:
    return httpx.get(f"{url}/traces/{request_id}", headers=AUTH, timeout=30)


def owner(response: httpx.Response) -> str | None:
    """The response id a trace's spans name (None: no trace)."""
    if response.status_code == 404:
        return None
    assert response.status_code == 200, response.text
    names = {s["attributes"].get("disaggsdk.request_id") for s in response.json()["spans"]} - {None}
    assert len(names) == 1, names
    return names.pop()


def test_a_trace_is_read_by_the_whole_response_id_or_x_request_id_only(served):
    router, runtime, url = served
    alice = complete(url, "alice-1")
    bob = complete(url)
    assert owner(trace(url, alice)) == alice == "cmpl-alice-1"
    assert owner(trace(url, "alice-1")) == alice  # the X-Request-Id it sent
    assert owner(trace(url, bob)) == bob and owner(trace(url, bob.removeprefix("cmpl-"))) == bob
    for probe in ("cmpl", "cmpl-", "cmpl-alice", "alice", "alice-", bob[:-1], bob[: len("cmpl-") + 8],
                  "chatcmpl-alice-1", key_of(runtime, alice)):
        r = trace(url, probe)
        assert r.status_code == 404, (probe, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{url}/traces/{alice}").status_code == 401  # behind the API key


def test_the_internal_key_is_in_no_trace_move_answer_or_error(served):
    router, runtime, url = served
    alice = complete(url, "alice-5")
    key = key_of(runtime, alice)
    assert key != alice and key.startswith(alice + "-")  # a client id gets a random part of the server's
    body = trace(url, alice).text
    assert key not in body and key.removeprefix(alice) not in body
    # a move names the request as its caller did
    held_key = internal_request_id("cmpl-alice-2")
    router.submit(held_key, [5, 6, 7], SamplingParams(max_tokens=HELD), lambda _ev: None, response_id="cmpl-alice-2")
    moved = httpx.post(f"{url}/requests/alice-2/move", json={"to": "decode-1"}, headers=AUTH, timeout=30)
    assert moved.status_code == 200 and moved.json()["moved"] and moved.json()["request_id"] == "alice-2", moved.text
    assert held_key not in moved.text
    silent_key = internal_request_id("cmpl-alice-3")
    router.submit(silent_key, [5, 6, 7], SamplingParams(max_tokens=SILENT), lambda _ev: None,
                  response_id="cmpl-alice-3")
    early = httpx.post(f"{url}/requests/alice-3/move", json={"to": "decode-1"}, headers=AUTH, timeout=30)
    assert early.status_code == 400 and "'alice-3' has not started decoding" in early.json()["error"]["message"]
    assert silent_key not in early.text
    router.abort_sync(silent_key)
    # a unit's refusal names the request by its key: the client reads its response id there
    refused = httpx.post(f"{url}/v1/completions", json={"prompt": [5], "max_tokens": REFUSED},
                         headers=AUTH | {"X-Request-Id": "alice-4"}, timeout=30)
    assert refused.status_code == 400 and "cmpl-alice-4: token ids" in refused.json()["error"]["message"], refused.text
    assert key_of(runtime, "cmpl-alice-4") not in refused.text


def test_a_drain_lists_the_requests_it_moved_by_their_response_ids():
    from disaggsdk.serve.http.client_request_ids import public_request_id

    runtime = AnsweringRuntime({"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"})
    router = Router(runtime)
    http = HttpServer(build_app(router, ServerMetrics(router.stats, router.model_name), api_key=KEY)).start()
    try:
        keys = [internal_request_id(f"cmpl-carol-{i}") for i in range(3)]
        for i, key in enumerate(keys):
            router.submit(key, [5, 6, 7], SamplingParams(max_tokens=HELD), lambda _ev: None,
                          response_id=f"cmpl-carol-{i}")
        holder = router.unit_of(keys[0])
        assert holder is not None
        drained = httpx.post(f"{http.url}/units/{holder}/drain", json={"timeout_s": 10}, headers=AUTH, timeout=30)
        assert drained.status_code == 200, drained.text
        moved = {m["request_id"] for m in drained.json()["moves"]}
        assert moved and moved <= {f"cmpl-carol-{i}" for i in range(3)}, drained.text
        assert not any(key in drained.text or key[-32:] in drained.text for key in keys)
    finally:
        http.stop()
        router.close()
    # the keys the server makes, and the ids a client sees for them
    assert public_request_id(internal_request_id("cmpl-x-1")) == "cmpl-x-1"
    assert public_request_id(internal_request_id("chatcmpl-a-b") + "-2") == "chatcmpl-a-b-2"
    server_made = "cmpl-" + "ab" * 16  # no client id: the response id is the key, nothing to hide
    assert public_request_id(server_made) == server_made and public_request_id(server_made + "-1") == server_made + "-1"


# the class, run again: random probes never read a trace their client does not own

def test_random_probes_read_only_the_trace_whose_whole_id_they_name(served):
    router, runtime, url = served
    owned = {}  # every public name -> the response id it owns
    for client_id, chat in (("carol-7", False), ("dave.x:1", True), (None, False), (None, True), ("carol-70", False)):
        response_id = complete(url, client_id, chat)
        owned[response_id] = owned[response_id.split("-", 1)[1]] = response_id
    keys = [key_of(runtime, r) for r in set(owned.values())]
    ids = sorted(owned) + keys

    def cut(text: str, data) -> str:
        start = data.draw(st.integers(0, len(text)))
        return text[start: data.draw(st.integers(start, len(text)))]

    with httpx.Client(base_url=url, headers=AUTH, timeout=30) as client:

        @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(st.data())
        def probe(data):
            base = data.draw(st.sampled_from(ids))
            kind = data.draw(st.sampled_from(["prefix", "substring", "whole", "suffix", "other text"]))
            name = {"prefix": lambda: base[: data.draw(st.integers(0, len(base)))],
                    "substring": lambda: cut(base, data),
                    "whole": lambda: base,
                    "suffix": lambda: base + data.draw(st.sampled_from(["-", "-0", "x", "/"])),
                    "other text": lambda: data.draw(st.text(alphabet="abcdefchatmpl-0123456789.:", max_size=24))}[kind]()
            if not name or "/" in name:
                return  # another route
            r = client.get(f"/traces/{name}")
            got = owner(r)
            assert got == owned.get(name), (name, r.status_code, r.text[:200])
            if got is not None:
                assert not any(k in r.text for k in keys if k not in owned), name  # no internal key in a trace body

        probe()
