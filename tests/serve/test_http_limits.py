"""The HTTP edge's bounds over real sockets: a request head that dribbles in (or never comes) is
answered 408 and closed, an idle kept-alive connection is closed, and past the queue bound a request
gets 503 with ``Retry-After`` until the queue drains; the server answers others all along."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import httpx
import pytest

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.serve.backend import TokenEvent
from disaggsdk.serve.http.http_limits import HttpLimits
from disaggsdk.serve.http.http_server import HttpServer
from disaggsdk.serve.http.openai_app import build_app
from disaggsdk.serve.metrics import ServerMetrics
from disaggsdk.spec.field_checks import FieldErrors
from disaggsdk.spec.serving import Serve

HEADER_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 0.5
BODY_TIMEOUT_S = 1.0
MAX_QUEUED_REQUESTS = 2
MARGIN_S = 2.0  # a loaded 2-core machine may run the timer late; a missing deadline never closes at all


class HeldBackend:
    """Bytes as tokens; every request waits for ``gate`` before its first (and only) event."""

    model_name = "fake-model"  # not in the catalog: no chat template, no vocabulary check
    supports_logprobs = False  # a `ServingBackend`'s contract: no logprobs, context unknown
    max_model_len = None

    def __init__(self):
        self.gate = threading.Event()
        self.num_waiting = 0

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i % 256 for i in ids).decode(errors="replace")

    async def generate(self, request_id, prompt_ids, params, client="", response_id=""):
        self.num_waiting += 1
        try:
            while not self.gate.is_set():
                await asyncio.sleep(0.01)
        finally:
            self.num_waiting -= 1
        yield TokenEvent(request_id, [104, 105], True, "length", instance="decode-0")

    async def abort(self, request_id):
        pass

    def stats(self, wait_s=0.0):
        return [InstanceStats("decode-0", "decode")]

    def close(self):
        pass

    def units(self):
        return None  # one engine in this process: no units to route, move or trace


@pytest.fixture(scope="module")
def served():
    backend = HeldBackend()
    limits = HttpLimits(HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, MAX_QUEUED_REQUESTS, BODY_TIMEOUT_S)
    app = build_app(backend, ServerMetrics(backend.stats, backend.model_name), limits=limits)
    http = HttpServer(app, limits=limits).start()
    try:
        yield backend, http.url
    finally:
        backend.gate.set()
        http.stop()


def connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=HEADER_TIMEOUT_S + MARGIN_S + 5)


def read_until_closed(sock: socket.socket) -> bytes:
    received = b""
    while chunk := sock.recv(4096):
        received += chunk
    return received


def read_response(sock: socket.socket) -> bytes:
    """One whole response (head and ``content-length`` bytes of body), leaving the connection open."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(4096)
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(4096)
    return head + b"\r\n\r\n" + body


def dribble(sock: socket.socket, data: bytes, between=lambda i: None) -> None:
    """Send ``data`` a byte every 0.1 s (``between(i)`` after byte i) until the server speaks or
    closes: stop there, before a write into a closed connection resets it."""
    for i, byte in enumerate(data):
        if select.select([sock], [], [], 0.1)[0]:
            return
        sock.sendall(bytes([byte]))
        between(i)


def test_a_head_sent_one_byte_at_a_time_is_answered_408_and_closed(served):
    backend, url = served
    backend.gate.set()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    sock = connect(url)
    started = time.monotonic()

    def health_answers(i: int) -> None:
        if i % 10 == 0:
            assert httpx.get(f"{url}/health", timeout=5).status_code == 200

    dribble(sock, head, health_answers)  # the whole head would take 8 s
    answer = read_until_closed(sock)
    closed_at = time.monotonic()
    sock.close()
    assert closed_at - started < HEADER_TIMEOUT_S + MARGIN_S, closed_at - started
    assert answer.startswith(b"HTTP/1.1 408 ") and b"serve.header_timeout_s" in answer, answer


def test_a_silent_connection_is_closed_and_a_prompt_one_is_served(served):
    backend, url = served
    backend.gate.set()
    silent = connect(url)
    started = time.monotonic()
    assert read_until_closed(silent).startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < HEADER_TIMEOUT_S + MARGIN_S
    silent.close()
    prompt = connect(url)
    prompt.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_response(prompt).startswith(b"HTTP/1.1 200 ")  # answered, and kept alive ...
    started = time.monotonic()
    assert read_until_closed(prompt) == b""  # ... until idle_timeout_s, with nothing more said
    assert time.monotonic() - started < IDLE_TIMEOUT_S + MARGIN_S
    prompt.close()


def test_past_the_queue_bound_a_request_gets_503_with_retry_after_until_it_drains(served):
    backend, url = served
    backend.gate.clear()
    body = {"prompt": "hi", "max_tokens": 2}
    with ThreadPoolExecutor(MAX_QUEUED_REQUESTS) as pool:
        held = [pool.submit(httpx.post, f"{url}/v1/completions", json=body, timeout=30)
                for _ in range(MAX_QUEUED_REQUESTS)]
        deadline = time.monotonic() + 10
        while backend.num_waiting < MAX_QUEUED_REQUESTS:
            assert time.monotonic() < deadline, "the held requests never reached the backend"
            time.sleep(0.01)
        refused = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == 503 and error["type"] == "server_error"
        assert "serve.max_queued_requests" in error["message"]
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # the server itself is fine
        scrape = httpx.get(f"{url}/metrics", timeout=5).text
        assert f'disaggsdk_front_end_requests_queued{{model_name="fake-model"}} {MAX_QUEUED_REQUESTS}.0' in scrape
        assert 'disaggsdk_requests_refused_total{model_name="fake-model",reason="queue_full"}' in scrape
        backend.gate.set()
        assert [h.result().status_code for h in held] == [200] * MAX_QUEUED_REQUESTS
    again = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == "hi"


def test_the_bounds_are_spec_keys_and_must_be_positive():
    limits = HttpLimits.from_spec(Serve(header_timeout_s=3, idle_timeout_s=2, max_queued_requests=7, body_timeout_s=4,
                                        max_connections=9))
    assert limits == HttpLimits(3, 2, 7, 4, 9)
    with pytest.raises(FieldErrors) as refused:
        Serve(header_timeout_s=0, max_queued_requests=-1, body_timeout_s=0, max_connections=0)
    assert {name for name, _ in refused.value.problems} == {"header_timeout_s", "max_queued_requests",
                                                              "body_timeout_s", "max_connections"}


def test_a_body_sent_one_byte_at_a_time_is_answered_408(served):
    backend, url = served
    backend.gate.set()
    body = b'{"prompt": "hello there, a body that takes its time", "max_tokens": 2}'
    sock = connect(url)
    started = time.monotonic()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
    dribble(sock, body)  # the whole body would take 7 s
    answer = read_response(sock)
    answered_at = time.monotonic()
    sock.close()
    assert answered_at - started < BODY_TIMEOUT_S + MARGIN_S, answered_at - started
    assert answer.startswith(b"HTTP/1.1 408 ") and b"serve.body_timeout_s" in answer, answer
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_past_max_connections_a_new_connection_gets_503():
    backend = HeldBackend()
    limits = HttpLimits(HEADER_TIMEOUT_S, IDLE_TIMEOUT_S, MAX_QUEUED_REQUESTS, BODY_TIMEOUT_S, max_connections=2)
    app = build_app(backend, ServerMetrics(backend.stats, backend.model_name), limits=limits)
    http = HttpServer(app, limits=limits).start()
    body = {"prompt": "hi", "max_tokens": 2}
    try:
        with ThreadPoolExecutor(2) as pool:
            held = [pool.submit(httpx.post, f"{http.url}/v1/completions", json=body, timeout=30) for _ in range(2)]
            deadline = time.monotonic() + 10
            while backend.num_waiting < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert backend.num_waiting == 2
            assert httpx.post(f"{http.url}/v1/completions", json=body, timeout=10).status_code == 503
            backend.gate.set()
            assert [f.result().status_code for f in held] == [200, 200]
        assert httpx.post(f"{http.url}/v1/completions", json=body, timeout=10).status_code == 200
    finally:
        backend.gate.set()
        http.stop()
