"""The API key: every route but the probes' (/health, /metrics unless asked, /version) wants
``Authorization: Bearer <key>``, the scheme in any case (RFC 7235), and the OpenAPI document, which
lists the operator routes (drain, rebalance, move), is one of them (issue 55 finding 8)."""

from __future__ import annotations

import httpx
import pytest

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.serve.backend import TokenEvent
from disaggsdk.serve.http.http_server import HttpServer
from disaggsdk.serve.http.openai_app import build_app
from disaggsdk.serve.metrics import ServerMetrics

KEY = "s3cret-key"


class TwoTokens:
    """A backend that answers every request with two tokens."""

    model_name = "fake-model"
    supports_logprobs = False
    max_model_len = None

    def encode(self, text):
        return list(text.encode())

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i % 256 for i in ids).decode(errors="replace")

    async def generate(self, request_id, prompt_ids, params, client="", response_id=""):
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
def url():
    backend = TwoTokens()
    http = HttpServer(build_app(backend, ServerMetrics(backend.stats, backend.model_name), api_key=KEY)).start()
    try:
        yield http.url
    finally:
        http.stop()


@pytest.mark.parametrize("header", [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER {KEY}", f"bEaReR  {KEY}"])
def test_the_bearer_scheme_is_matched_in_any_case(url, header):
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"Authorization": header})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("header", [None, KEY, f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer{KEY}", "Bearer", f"Bearer {KEY[:-1]}"])
def test_anything_but_the_key_under_the_bearer_scheme_is_a_401(url, header):
    headers = {"Authorization": header} if header is not None else {}
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=headers)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_the_openapi_document_wants_the_key_and_the_doc_pages_are_not_served(url):
    refused = httpx.get(f"{url}/openapi.json")
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    doc = httpx.get(f"{url}/openapi.json", headers={"Authorization": f"bearer {KEY}"})
    assert doc.status_code == 200 and "/v1/completions" in doc.json()["paths"]
    for page in ("/docs", "/redoc"):  # no HTML pages at all: nothing to serve without the key
        assert httpx.get(f"{url}{page}").status_code == 404
        assert httpx.get(f"{url}{page}", headers={"Authorization": f"Bearer {KEY}"}).status_code == 404
    assert httpx.get(f"{url}/health").status_code == 200  # probes need no key


def test_without_a_key_the_openapi_document_is_public():
    backend = TwoTokens()
    http = HttpServer(build_app(backend, ServerMetrics(backend.stats, backend.model_name))).start()
    try:
        assert httpx.get(f"{http.url}/openapi.json").status_code == 200
    finally:
        http.stop()


def test_a_bearer_token_is_read_from_the_header_as_rfc_6750_writes_it():
    from disaggsdk.serve.http.http_guard import bearer_token

    assert bearer_token(f"Bearer {KEY}") == KEY
    assert bearer_token(f"bearer   {KEY}") == KEY
    assert bearer_token(f"Basic {KEY}") is None
    assert bearer_token(f"Bearer{KEY}") is None
    assert bearer_token("Bearer ") is None and bearer_token("") is None and bearer_token(None) is None
