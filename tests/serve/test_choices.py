"""n samples and batched prompts: one response with a choice per (prompt, sample) in OpenAI's order,
seeded samples that differ from each other and repeat run to run, streamed choices with their index,
and usage that counts each prompt once."""

from __future__ import annotations

import json

import httpx
import pytest

openai = pytest.importorskip("openai")


def test_batched_prompts_times_n_whole(deployment):
    body = {"prompt": ["def f(x):", [5, 6, 7]], "n": 2, "max_tokens": 6, "temperature": 1.0, "seed": 11,
            "ignore_eos": True, "return_token_ids": True}
    r = httpx.post(f"{deployment.url}/v1/completions", json=body).json()
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    again = httpx.post(f"{deployment.url}/v1/completions", json=body).json()
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in r["choices"]]  # seeded
    assert r["choices"][0]["token_ids"] != r["choices"][1]["token_ids"]  # sample i draws with seed + i
    one = httpx.post(f"{deployment.url}/v1/completions", json=body | {"prompt": [5, 6, 7], "n": 1}).json()
    assert one["choices"][0]["token_ids"] == r["choices"][2]["token_ids"]  # prompt 1, sample 0: seed 11
    prompt_tokens = httpx.post(f"{deployment.url}/tokenize", json={"prompt": "def f(x):"}).json()["count"] + 3
    assert r["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 24, "total_tokens": prompt_tokens + 24,
                          "prompt_tokens_details": {"cached_tokens": 0}}  # both prompts shorter than a page


def test_n_streamed_with_the_openai_client(deployment):
    client = openai.OpenAI(base_url=f"{deployment.url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=deployment.model_name, messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=5,
        temperature=1.0, seed=4, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True})
    texts, reasons, usage = {}, {}, None
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            reasons[c.index] = c.finish_reason or reasons.get(c.index)
        usage = chunk.usage or usage
    assert sorted(texts) == [0, 1, 2] and set(reasons.values()) == {"length"}
    assert usage.completion_tokens == 15
    whole = client.chat.completions.create(
        model=deployment.model_name, messages=[{"role": "user", "content": "hi"}], n=3, max_tokens=5,
        temperature=1.0, seed=4, extra_body={"ignore_eos": True})
    assert [c.message.content for c in whole.choices] == [texts[i] for i in range(3)]  # same seeds, same text
    assert json.loads(whole.model_dump_json())["usage"]["completion_tokens"] == 15
