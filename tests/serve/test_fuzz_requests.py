"""Arbitrary JSON thrown at both endpoints over real HTTP: never a 5xx, always an OpenAI error
object for a refusal, and the engine keeps serving (hypothesis, 2,000 bodies per endpoint)."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES_PER_ENDPOINT = 2000
MAX_TOKENS_GENERATED = 8

# JSON values of every kind, nested; numbers include the edges that broke servers before
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                                        max_size=4), max_leaves=12)
FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k",
          "seed", "stop", "stop_token_ids", "ignore_eos", "logprobs", "top_logprobs", "stream", "stream_options",
          "n", "return_token_ids", "response_format", "structured_outputs", "tools", "logit_bias", "guided_json",
          "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern"]
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "robot"]) | JSON,
                                 "content": st.text(max_size=30) | JSON})
PLAUSIBLE = st.dictionaries(st.sampled_from(FIELDS), JSON | st.lists(MESSAGE, max_size=3), max_size=6)
BODIES = PLAUSIBLE | JSON


def check(client: httpx.Client, path: str, body: object) -> None:
    body = {k: v for k, v in body.items() if k != "stream"} if isinstance(body, dict) else body  # no SSE here
    if isinstance(body, dict):  # a valid body generates: keep every run short, whatever it asks
        for name in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(name), int) and body[name] > MAX_TOKENS_GENERATED:
                body[name] = MAX_TOKENS_GENERATED
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = MAX_TOKENS_GENERATED  # chat's default is 256 tokens
    try:
        r = client.post(path, json=body)
    except ValueError:  # a float the JSON encoder refuses (NaN is written, so this is rare)
        return
    assert r.status_code < 500, (path, body, r.status_code, r.text)
    if r.status_code >= 400:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and "type" in error


# 17 s each: the default run fuzzes chat completions, whose body is the larger; make test-all both
@pytest.mark.parametrize("path", [pytest.param("/v1/completions", marks=pytest.mark.slow), "/v1/chat/completions"])
def test_no_body_gets_a_5xx_or_takes_the_engine_down(deployment, path):
    with httpx.Client(base_url=deployment.url, timeout=60) as client:

        @settings(max_examples=EXAMPLES_PER_ENDPOINT, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(BODIES)
        def fuzz(body):
            check(client, path, body)

        fuzz()
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        ok = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_fuzzed_bodies_kill_no_unit_of_a_launched_deployment():
    from disaggsdk.face.deployment import launch
    from tests.launch._helpers import make_spec

    spec = make_spec("qwen3-coder-tiny", num_pages=256, budget=64)
    with launch(spec, port=0, max_restarts=0) as d, httpx.Client(base_url=d.url, timeout=60) as client:

        @settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), BODIES)
        def fuzz(path, body):
            check(client, path, body)

        fuzz()
        assert not d.backend.runtime.failures  # no unit died
        assert client.get("/health").json()["status"] == "ok"


# Tool names and parameter names built from the call format's own markup: a name must never reach a
# forced call's grammar (an HTTP 500 before: "the output's grammar cannot continue")
MARKUP = st.sampled_from(["</function>", "<function=", "<tool_call>", "</tool_call>", "<parameter=", "</parameter>",
                          ">", "<", "\n", "<|im_end|>", " ", "f", "get_weather", "-", "_", "é"])
MARKUP_TEXT = st.lists(MARKUP, min_size=0, max_size=6).map("".join)
TOOL_CHOICES = [None, "auto", "required", "named"]
EXAMPLES_OF_MARKUP = 200


class TestToolNamesWithMarkup:
    @staticmethod
    def body(name: str, key: str, choice: str | None) -> dict:
        tool = {"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {key: {"type": "integer"}}, "required": [key]}}}
        body = {"messages": [{"role": "user", "content": "call it"}], "tools": [tool], "max_tokens": 48}
        if choice == "named":
            body["tool_choice"] = {"type": "function", "function": {"name": name}}
        elif choice is not None:
            body["tool_choice"] = choice
        return body

    def test_no_tool_or_parameter_name_gets_a_5xx(self, deployment):
        from disaggsdk.serve.http.chat_request import TOOL_NAME

        with httpx.Client(base_url=deployment.url, timeout=60) as client:

            @settings(max_examples=EXAMPLES_OF_MARKUP, deadline=None, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(MARKUP_TEXT, MARKUP_TEXT | st.just("n"), st.sampled_from(TOOL_CHOICES))
            def fuzz(name, key, choice):
                r = client.post("/v1/chat/completions", json=self.body(name, key, choice))
                assert r.status_code < 500, (name, key, choice, r.status_code, r.text)
                if not TOOL_NAME.fullmatch(name):
                    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.name", r.text
                elif r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "tool_calls":
                    calls = r.json()["choices"][0]["message"]["tool_calls"]
                    assert calls and all(c["function"]["name"] == name for c in calls), r.text

            fuzz()
            assert client.get("/health").json()["status"] == "ok"


# Client request ids, valid, invalid and repeated, on requests in flight together: a repeat may be
# refused (400 naming X-Request-Id), but no request is ever cut short by another's id
# (h11, under httpx, refuses to send a value with a space at either end: such an id never leaves the client)
REQUEST_IDS = st.sampled_from(["dup", "dup", "other"]) | st.text(st.characters(min_codepoint=32, max_codepoint=126),
                                                                max_size=140).filter(lambda v: v == v.strip(" "))
EXAMPLES_OF_REQUEST_IDS = 60
NUM_TOGETHER = 4


def test_repeated_request_ids_get_a_400_or_a_whole_answer_never_a_5xx(deployment):
    from concurrent.futures import ThreadPoolExecutor

    from disaggsdk.serve.http.client_request_ids import client_request_id

    body = {"prompt": [5, 6, 7], "max_tokens": MAX_TOKENS_GENERATED, "ignore_eos": True}
    with httpx.Client(base_url=deployment.url, timeout=60) as client, ThreadPoolExecutor(NUM_TOGETHER) as pool:

        @settings(max_examples=EXAMPLES_OF_REQUEST_IDS, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(st.lists(REQUEST_IDS, min_size=2, max_size=NUM_TOGETHER))
        def fuzz(ids):
            answers = list(pool.map(lambda i: client.post("/v1/completions", json=body, headers={"X-Request-Id": i}),
                                    ids))
            usable = [client_request_id(i.strip(" \t")) for i in ids]  # h11 trims a header value's ends
            for sent, server_id, r in zip(ids, usable, answers):
                assert r.status_code in (200, 400), (sent, r.status_code, r.text)
                if r.status_code == 400:
                    assert server_id is not None and usable.count(server_id) > 1, (sent, r.text)
                    assert r.json()["error"]["param"] == "X-Request-Id"
                    continue
                assert r.json()["choices"][0]["finish_reason"] == "length", (sent, r.text)
                assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS_GENERATED
                assert (r.headers["x-request-id"] == server_id) if server_id else r.headers["x-request-id"]

        fuzz()
        assert client.get("/health").json()["status"] == "ok"


# Request heads that never complete, sent a byte at a time: each connection is answered 408 (or 400
# for bytes that are not HTTP) and closed, while whole requests are served beside them
QUICK_HEADER_TIMEOUT_S = 1.0
HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Pad: "
PARTIAL_HEADS = st.integers(0, len(HEAD)).map(lambda n: HEAD[:n]) | st.binary(max_size=60).filter(
    lambda b: b"\r\n\r\n" not in b and b"\n\n" not in b)
NUM_SLOW_CONNECTIONS = 12
RESET = b"(reset by the server after it closed)"


def test_heads_sent_slowly_are_closed_without_a_5xx_while_requests_are_served():
    import select
    import socket
    import threading
    import time
    from urllib.parse import urlsplit

    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model
    from disaggsdk.serve.http.http_limits import HttpLimits
    from tests.serve.conftest import SERVED_MODEL

    limits = HttpLimits(QUICK_HEADER_TIMEOUT_S, idle_timeout_s=5.0, max_queued_requests=1024)
    heads = st.lists(PARTIAL_HEADS, min_size=NUM_SLOW_CONNECTIONS, max_size=NUM_SLOW_CONNECTIONS)
    answers: list[tuple[bytes, bytes, float]] = []

    def dribble(address: tuple[str, int], head: bytes) -> None:
        sock = socket.create_connection(address, timeout=30)
        started = time.monotonic()
        received = b""
        try:
            for byte in head + b"x" * 100:  # past the head: padding, so the connection never goes quiet
                if select.select([sock], [], [], 0.05)[0]:
                    break
                sock.sendall(bytes([byte]))
            while chunk := sock.recv(4096):
                received += chunk
        except ConnectionResetError:
            # the server answered and closed while a byte of ours was on its way: its kernel resets a
            # connection closed with unread bytes, and the reset may overtake the answer. Closed all
            # the same (what this test is about); the answers that do arrive are checked below
            received = received or RESET
        answers.append((head, received, time.monotonic() - started))
        sock.close()

    with serve_model(SERVED_MODEL, EngineConfig(num_pages=64, max_num_seqs=4), port=0, limits=limits) as d:
        parts = urlsplit(d.url)
        address = (parts.hostname, parts.port)

        @settings(max_examples=3, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(heads)
        def fuzz(partial_heads):
            answers.clear()
            threads = [threading.Thread(target=dribble, args=(address, h)) for h in partial_heads]
            for t in threads:
                t.start()
            ok = httpx.post(f"{d.url}/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}, timeout=30)
            assert ok.status_code == 200
            for t in threads:
                t.join(timeout=30)
            assert len(answers) == len(partial_heads)
            for head, received, held_s in answers:
                assert received.startswith((b"HTTP/1.1 408 ", b"HTTP/1.1 400 ", RESET)), (head, received)
                assert held_s < QUICK_HEADER_TIMEOUT_S + 3.0, (head, held_s)

        fuzz()


# The probe's poison (issue 33) and its relatives: constraints whose grammars are huge. Each must be
# refused (or served) by the edge or by the decode unit alone; before, a 70,000-string choice list
# passed the edge's validation and took down every decode unit that built its matcher in turn.
HUGE = 70_000
HUGE_CONSTRAINTS = {
    "choice": {"structured_outputs": {"choice": [f"option number {i}" for i in range(HUGE)]}},
    "enum schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {
        "type": "object", "properties": {"pick": {"enum": [f"v{i}" for i in range(HUGE)]}}}}}},
    "lark rule": {"structured_outputs": {"grammar": "start: " + " | ".join(f'"w{i}"' for i in range(30_000))}},
    "lark rule under the size limit": {  # builds; a rule this wide fails at its first token
        "structured_outputs": {"grammar": "start: " + " | ".join(f'"w{i}"' for i in range(5_000))}},
    "regex": {"structured_outputs": {"regex": "(" + "|".join(f"r{i}" for i in range(HUGE)) + ")"}},
    "choice under the size limit": {"structured_outputs": {"choice": [f"c{i}" for i in range(10_000)]}},
    "tool schema": {"tools": [{"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"x": {"enum": [f"t{i}" for i in range(HUGE)]}}}}}],
        "tool_choice": "required"},
}


def test_huge_constraints_get_no_5xx_and_kill_no_unit_of_a_launched_deployment():
    import attrs

    from disaggsdk.face.deployment import launch
    from tests.launch._helpers import make_spec

    spec = make_spec("qwen3-coder-tiny", decode_replicas=2, num_pages=128, budget=32)
    spec = attrs.evolve(spec, engine=attrs.evolve(spec.engine, compile=False))
    with launch(spec, port=0, max_restarts=0) as d, httpx.Client(base_url=d.url, timeout=60) as client:
        statuses = {}
        for name, constraint in HUGE_CONSTRAINTS.items():
            for path in ("/v1/chat/completions", "/v1/completions"):
                if path == "/v1/completions" and "tools" in constraint:
                    continue
                body = {"prompt": "Pick one:"} if path == "/v1/completions" else {
                    "messages": [{"role": "user", "content": "Pick one."}]}
                r = client.post(path, json=body | constraint | {"max_tokens": 8})
                assert r.status_code < 500, (name, path, r.status_code, r.text[:500])
                assert len(r.content) < 20_000, (name, "an error carries the whole grammar")
                statuses[name, path] = r.status_code
        assert all(statuses[n, p] == 400 for n, p in statuses if "under the size limit" not in n), statuses
        assert statuses["choice under the size limit", "/v1/chat/completions"] == 200
        assert not d.backend.runtime.failures  # no unit died
        assert client.get("/health").json()["status"] == "ok"
