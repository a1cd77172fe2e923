"""Every error path of the front end answers an OpenAI error object, over real HTTP (uvicorn on a
free port): ``{"error": {"message", "type", "param", "code"}}`` with the right status and a JSON
content type, one test per status; and optional CORS."""

from __future__ import annotations

import logging

import httpx
import pytest

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.serve.backend import TokenEvent
from disaggsdk.serve.http.http_server import HttpServer
from disaggsdk.serve.http.openai_app import build_app
from disaggsdk.serve.metrics import ServerMetrics

SECRET = "/home/alice/.keys/token-1234"  # what a crash's message may carry: never sent to the client


class FakeBackend:
    """Bytes as tokens; ``mode`` decides what a request meets: tokens, a crash, or no engine up."""

    model_name = "fake-model"  # not in the catalog: no chat template, no vocabulary check
    supports_logprobs = False  # a `ServingBackend`'s contract: no logprobs, context unknown
    max_model_len = None

    def __init__(self):
        self.mode = "ok"

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i % 256 for i in ids).decode(errors="replace")

    async def generate(self, request_id, prompt_ids, params, client="", response_id=""):
        if self.mode == "crash":
            raise RuntimeError(f"cannot read {SECRET}")
        if self.mode == "down":
            yield TokenEvent(request_id, [], True, "error", error="the decode engine is gone", instance="decode-0")
            return
        yield TokenEvent(request_id, [104, 105], True, "length", instance="decode-0")

    async def abort(self, request_id):
        pass

    def stats(self, wait_s=0.0):
        return [InstanceStats("decode-0", "decode", healthy=self.mode != "down")]

    def close(self):
        pass

    def units(self):
        return None  # one engine in this process: no units to route, move or trace


def serve(backend, **options):
    app = build_app(backend, ServerMetrics(backend.stats, backend.model_name), **options)
    return app, HttpServer(app).start()


@pytest.fixture(scope="module")
def server():
    backend = FakeBackend()
    app, http = serve(backend, api_key=None, max_body_bytes=1024)

    @app.get("/typed")  # a route with a typed parameter: FastAPI validates it before our code runs
    async def typed(n: int) -> dict:
        return {"n": n}

    try:
        yield backend, http.url
    finally:
        http.stop()


def error_of(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and error["code"] == status
    return error


def test_an_unknown_route_is_a_404_naming_the_routes(server):
    _, url = server
    for method, path in (("GET", "/nope"), ("POST", "/v1/embeddings")):
        error = error_of(httpx.request(method, f"{url}{path}", json={}), 404)
        assert path in error["message"] and "/v1/chat/completions" in error["message"]
        assert error["type"] == "invalid_request_error"


def test_a_wrong_method_is_a_405_saying_which_methods(server):
    _, url = server
    r = httpx.get(f"{url}/v1/completions")
    error = error_of(r, 405)
    assert r.headers["allow"] == "POST" and "use POST" in error["message"]
    error_of(httpx.request("OPTIONS", f"{url}/v1/chat/completions"), 405)  # no CORS configured: no preflight


def test_a_bad_body_is_a_400_naming_the_field(server):
    _, url = server
    error = error_of(httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 0}), 400)
    assert error["param"] == "max_tokens" and error["type"] == "invalid_request_error"
    error_of(httpx.post(f"{url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}),
             400)
    # the framework's own validation answers 400 too (vLLM's status, not FastAPI's 422 with "detail")
    error = error_of(httpx.get(f"{url}/typed", params={"n": "three"}), 400)
    assert error["param"] == "n"


@pytest.mark.parametrize("status, request_kw, kind", [
    (403, {"headers": {"Host": "evil.example"}}, "permission_error"),
    (413, {"json": {"prompt": "x" * 2000}}, "invalid_request_error"),
    (415, {"content": b'{"prompt": "x"}', "headers": {"content-type": "text/plain"}}, "invalid_request_error"),
])
def test_refusals_before_the_body_is_read(server, status, request_kw, kind):
    _, url = server
    assert error_of(httpx.post(f"{url}/v1/completions", **request_kw), status)["type"] == kind


def test_a_missing_api_key_is_a_401():
    _, http = serve(FakeBackend(), api_key="k")
    try:
        error = error_of(httpx.post(f"{http.url}/v1/completions", json={"prompt": "x"}), 401)
        assert error["type"] == "authentication_error"
    finally:
        http.stop()


def test_a_crash_is_a_500_without_its_details_and_is_logged(server, caplog):
    backend, url = server
    backend.mode = "crash"
    try:
        with caplog.at_level(logging.ERROR, logger="disaggsdk.serve.http.error_bodies"):
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2})
    finally:
        backend.mode = "ok"
    error = error_of(r, 500)
    assert error["type"] == "server_error" and "RuntimeError" in error["message"]
    assert SECRET not in r.text and "Traceback" not in r.text
    assert any("/v1/completions" in rec.getMessage() and "RuntimeError" in rec.getMessage() for rec in caplog.records)
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_no_engine_up_is_a_503_on_requests_and_on_health(server):
    backend, url = server
    backend.mode = "down"
    try:
        error = error_of(httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}), 503)
        assert error["type"] == "server_error" and "no serving instance" in error["message"]
        health = httpx.get(f"{url}/health")
        error_of(health, 503)
        assert health.json()["status"] == "down" and health.json()["instances"] == {"decode-0": "down"}
    finally:
        backend.mode = "ok"
    assert "error" not in httpx.get(f"{url}/health").json()


def test_cors_lets_listed_origins_in_and_refuses_others_as_openai_errors():
    page, other = "https://ui.example.com", "https://evil.example"
    _, http = serve(FakeBackend(), allowed_origins=[page])
    url = http.url
    try:
        preflight = {"Origin": page, "Access-Control-Request-Method": "POST",
                     "Access-Control-Request-Headers": "authorization, content-type"}
        ok = httpx.request("OPTIONS", f"{url}/v1/completions", headers=preflight)
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == page
        assert "POST" in ok.headers["access-control-allow-methods"]
        refused = httpx.request("OPTIONS", f"{url}/v1/completions", headers=preflight | {"Origin": other})
        assert "origin" in error_of(refused, 400)["message"]
        # the listed page's request passes the web-page guard and its answer is readable by the page
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"Origin": page})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == page
        assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
        assert error_of(httpx.post(f"{url}/v1/completions", json={"prompt": "x"}, headers={"Origin": other}),
                        403)["type"] == "permission_error"
    finally:
        http.stop()


def test_any_origin_with_a_star():
    _, http = serve(FakeBackend(), allowed_origins=["*"])
    try:
        r = httpx.post(f"{http.url}/v1/completions", json={"prompt": "x", "max_tokens": 2},
                       headers={"Origin": "https://anywhere.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    finally:
        http.stop()
