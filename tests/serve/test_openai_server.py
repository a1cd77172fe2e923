"""The OpenAI-compatible server against a real in-process engine: the official client, SSE,
/metrics through the Prometheus parser, 400s naming the field, the API key, disconnects."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import SERVED_MODEL


def families(url: str) -> dict:
    text = httpx.get(f"{url}/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


def histogram_count(fams: dict, name: str) -> float:
    return sum(s.value for s in fams[name].samples if s.name == f"{name}_count")


def test_openai_client_streams_a_chat_completion(deployment):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{deployment.url}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=SERVED_MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=12, temperature=0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    assert content[-1].choices[0].finish_reason == "length"
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.completion_tokens == 12 and usage.prompt_tokens > 0
    # the same request without streaming gives the same greedy text
    whole = client.chat.completions.create(
        model=SERVED_MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.choices[0].message.content == "".join(c.choices[0].delta.content or "" for c in content)
    assert whole.usage.completion_tokens == 12


def test_metrics_parse_and_ttft_count_equals_requests_served(deployment):
    before = histogram_count(families(deployment.url), "disaggsdk_time_to_first_token_seconds")
    for i in range(3):
        r = httpx.post(f"{deployment.url}/v1/completions",
                       json={"prompt": f"req {i}", "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
    httpx.post(f"{deployment.url}/v1/completions", json={"prompt": "x", "max_tokens": 0})  # refused: not served
    fams = families(deployment.url)
    assert histogram_count(fams, "disaggsdk_time_to_first_token_seconds") == before + 3
    for name in ("disaggsdk_inter_token_latency_seconds", "disaggsdk_request_time_per_output_token_seconds",
                 "disaggsdk_e2e_request_latency_seconds", "disaggsdk_request_decode_time_seconds",
                 "disaggsdk_request_prompt_tokens", "disaggsdk_request_generation_tokens"):
        assert fams[name].type == "histogram"
    assert histogram_count(fams, "disaggsdk_request_generation_tokens") == histogram_count(
        fams, "disaggsdk_time_to_first_token_seconds")
    gauges = {s.labels["engine"]: s.value for s in fams["disaggsdk_num_requests_running"].samples}
    assert gauges == {"mixed-0": 0.0}
    assert fams["disaggsdk_kv_pages_capacity"].samples[0].value == 256
    assert 0.0 <= fams["disaggsdk_kv_cache_usage_perc"].samples[0].value <= 1.0
    assert "disaggsdk_num_preemptions" in fams  # the in-process engine counts them
    assert "disaggsdk_kv_transfer_bytes" in fams and "disaggsdk_kv_transfer_failures" in fams


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "temperature": -1}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": "3"}, "top_k"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": ["x"] * 40, "n": 2}, "n"),
    ({"prompt": ["x", 3]}, "prompt"),
    ({"prompt": "x", "stop": [""]}, "stop"),
    ({"prompt": "x", "logprobs": 99}, "logprobs"),
    ({"max_tokens": 3}, "prompt"),
    ({"prompt": "x", "model": "gpt-9"}, "model"),
    ({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"prompt": "x", "response_format": {"type": "xml"}}, "response_format.type"),
    ({"prompt": "x", "structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
    ({"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"99999": 1}}, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"5": 101}}, "logit_bias"),
])
def test_bad_completion_requests_get_400_naming_the_field(deployment, body, param):
    r = httpx.post(f"{deployment.url}/v1/completions", json=body)
    assert r.status_code == (404 if param == "model" else 400)
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"]


def test_penalties_bias_and_min_tokens_are_applied(deployment):
    base = {"prompt": [5, 6, 7, 5, 6, 7], "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    plain = httpx.post(f"{deployment.url}/v1/completions", json=base).json()["choices"][0]["token_ids"]
    biased = httpx.post(f"{deployment.url}/v1/completions",
                        json=base | {"logit_bias": {"9": 100}}).json()["choices"][0]["token_ids"]
    assert biased == [9] * 12 != plain  # +100 on token 9 makes it every greedy choice
    penalised = httpx.post(f"{deployment.url}/v1/completions", json=base | {
        "logit_bias": {"9": 100}, "frequency_penalty": 2.0, "repetition_penalty": 2.0,
        "presence_penalty": 2.0, "min_tokens": 12, "min_p": 0.1}).json()["choices"][0]
    assert penalised["token_ids"][0] == 9 and penalised["finish_reason"] == "length"


def test_special_tokens_and_stop_strings_on_request(deployment):
    base = {"prompt": "x", "max_tokens": 2, "temperature": 0, "logit_bias": {"3": 100}}  # 3: <tool_call>
    hidden = httpx.post(f"{deployment.url}/v1/completions", json=base).json()["choices"][0]["text"]
    shown = httpx.post(f"{deployment.url}/v1/completions",
                       json=base | {"skip_special_tokens": False}).json()["choices"][0]["text"]
    assert hidden == "" and shown == "<tool_call><tool_call>"
    plain = {"prompt": "def f(x):", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    text = httpx.post(f"{deployment.url}/v1/completions", json=plain).json()["choices"][0]["text"]
    stop = text[3:5]
    kept = httpx.post(f"{deployment.url}/v1/completions",
                      json=plain | {"stop": [stop], "include_stop_str_in_output": True}).json()["choices"][0]
    assert kept["text"] == text[: text.index(stop) + len(stop)] and kept["finish_reason"] == "stop"


def test_bad_chat_requests_and_bad_json(deployment):
    r = httpx.post(f"{deployment.url}/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].role"
    r = httpx.post(f"{deployment.url}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    # a request over the model's context (4,096 positions) is refused at the edge, saying by how much
    r = httpx.post(f"{deployment.url}/v1/completions", json={"prompt": [1] * 10, "max_tokens": 5000})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "max_tokens" and "914 too many" in err["message"]
    r = httpx.post(f"{deployment.url}/v1/completions", json={"prompt": [1] * 5000, "max_tokens": 2})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "prompt" and "906 too many" in err["message"]


def test_stop_strings_logprobs_token_ids_and_models(deployment):
    url = deployment.url
    base = {"prompt": [256, 1, 2, 3], "max_tokens": 24, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    full = httpx.post(f"{url}/v1/completions", json=base).json()["choices"][0]
    text = full["text"]
    stop = next((text[i:i + 2] for i in range(2, len(text) - 2) if text[i:i + 2].isprintable()
                 and text.find(text[i:i + 2]) == i), None)
    if stop is not None:
        cut = httpx.post(f"{url}/v1/completions", json=base | {"stop": [stop]}).json()["choices"][0]
        assert cut["text"] == text[: text.index(stop)] and cut["finish_reason"] == "stop"
    lp = httpx.post(f"{url}/v1/completions", json=base | {"logprobs": 2, "max_tokens": 5}).json()["choices"][0]
    assert len(lp["logprobs"]["token_logprobs"]) == 5 == len(lp["token_ids"])
    assert all(len(top) <= 2 for top in lp["logprobs"]["top_logprobs"])
    assert lp["token_ids"] == full["token_ids"][:5]
    models = httpx.get(f"{url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == [SERVED_MODEL]
    health = httpx.get(f"{url}/health")
    assert health.status_code == 200 and health.json() == {"status": "ok", "instances": {"mixed-0": "up"}}


def test_client_disconnect_aborts_the_request(deployment):
    url = deployment.url
    body = {"prompt": "long", "max_tokens": 3000, "ignore_eos": True, "stream": True, "temperature": 0}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"]
    # the engine drops the request and frees its pages soon after the client left
    deadline = time.monotonic() + 5  # the full request would take >10 s
    while time.monotonic() < deadline:
        stats = deployment.backend.stats()[0]
        if stats.running == 0 and stats.kv_pages_used == 0:
            break
        time.sleep(0.05)
    assert stats.running == 0 and stats.kv_pages_used == 0


def test_api_key_is_enforced_when_set():
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model(SERVED_MODEL, EngineConfig(num_pages=64), port=0, api_key="s3cret",
                     metrics_require_key=True) as d:
        assert httpx.get(f"{d.url}/metrics").status_code == 401  # asked for: /metrics behind the key too
        assert httpx.get(f"{d.url}/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        body = {"prompt": "x", "max_tokens": 2}
        assert httpx.post(f"{d.url}/v1/completions", json=body).status_code == 401
        wrong = httpx.post(f"{d.url}/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        ok = httpx.post(f"{d.url}/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert httpx.get(f"{d.url}/health").status_code == 200  # probes need no key
        assert d.generate("hi", max_tokens=2) is not None  # the Deployment sends its own key


def test_foreign_hosts_and_web_page_origins_are_refused(deployment):
    body = {"prompt": [5, 6], "max_tokens": 2}
    rebound = httpx.post(f"{deployment.url}/v1/completions", json=body, headers={"Host": "evil.example"})
    assert rebound.status_code == 403 and rebound.json()["error"]["type"] == "permission_error"
    page = httpx.post(f"{deployment.url}/v1/completions", json=body, headers={"Origin": "https://evil.example"})
    assert page.status_code == 403 and "web pages" in page.json()["error"]["message"]
    as_text = httpx.post(f"{deployment.url}/v1/completions", content=b'{"prompt": "x"}',
                         headers={"Content-Type": "text/plain"})  # what a cross-site form may send
    assert as_text.status_code == 415
    assert httpx.get(f"{deployment.url}/health", headers={"Host": "evil.example"}).status_code == 403
    local = httpx.post(f"{deployment.url}/v1/completions", json=body, headers={"Origin": "http://localhost:3000"})
    assert local.status_code == 200
