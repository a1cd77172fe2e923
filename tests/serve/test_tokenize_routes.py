"""vLLM's utility endpoints and request ids: /tokenize (prompt or chat), /detokenize, /version,
max_model_len in /v1/models, X-Request-Id passed through; bad bodies get OpenAI error objects."""

from __future__ import annotations

import httpx

from disaggsdk import __version__
from disaggsdk.engine.tokenizer import load_tokenizer
from tests.serve.conftest import SERVED_MODEL


def test_tokenize_detokenize_version_and_models(deployment):
    url, tok = deployment.url, load_tokenizer(SERVED_MODEL)
    r = httpx.post(f"{url}/tokenize", json={"prompt": "def f(x):"}).json()
    assert r["tokens"] == tok.encode("def f(x):") and r["count"] == len(r["tokens"]) and r["max_model_len"] > 0
    chat = httpx.post(f"{url}/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    served = httpx.post(f"{url}/v1/chat/completions",
                        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).json()
    assert chat["count"] == served["usage"]["prompt_tokens"]  # the same rendering as a chat request
    assert httpx.post(f"{url}/detokenize", json={"tokens": r["tokens"]}).json() == {"prompt": "def f(x):"}
    assert httpx.get(f"{url}/version").json() == {"version": __version__}
    (entry,) = httpx.get(f"{url}/v1/models").json()["data"]
    assert entry["max_model_len"] == r["max_model_len"]
    for path, body, param in [("/tokenize", {"prompt": 3}, "prompt"), ("/detokenize", {"tokens": ["a"]}, "tokens"),
                              ("/detokenize", {"tokens": [10**9]}, "tokens")]:
        bad = httpx.post(f"{url}{path}", json=body)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == param


def test_x_request_id_is_passed_through(deployment):
    body = {"prompt": "x", "max_tokens": 2}
    r = httpx.post(f"{deployment.url}/v1/completions", json=body, headers={"X-Request-Id": "trace-42.a"})
    assert r.headers["x-request-id"] == "trace-42.a" and r.json()["id"] == "cmpl-trace-42.a"
    streamed = httpx.post(f"{deployment.url}/v1/completions", json=body | {"stream": True},
                          headers={"X-Request-Id": "trace-43"})
    assert streamed.headers["x-request-id"] == "trace-43"
    unusable = httpx.post(f"{deployment.url}/v1/completions", json=body, headers={"X-Request-Id": "a b/c"})
    assert unusable.headers["x-request-id"] != "a b/c" and unusable.status_code == 200  # replaced by our own id
