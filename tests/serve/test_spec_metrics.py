"""Speculative decoding behind the OpenAI server: the same text as without it, and vLLM's
spec_decode counters (per draft position too) on /metrics."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.speculative.config import SpeculativeConfig
from disaggsdk.face.deployment import serve_model
from tests.serve.test_openai_server import families

BODY = {"prompt": "class Stack:\n    def __init__(self):", "max_tokens": 24, "temperature": 0, "ignore_eos": True}


def completion(engine_config: EngineConfig) -> tuple[str, dict]:
    with serve_model("deepseek-r1-tiny", engine_config, port=0) as d:
        r = httpx.post(f"{d.url}/v1/completions", json=BODY)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"], families(d.url)


def test_speculative_server_gives_the_same_text_and_exports_acceptance():
    plain, _ = completion(EngineConfig(num_pages=64))
    text, fams = completion(EngineConfig(num_pages=64, speculative=SpeculativeConfig("mtp", 2)))
    assert text == plain
    accepted = fams["disaggsdk_spec_decode_num_accepted_tokens"].samples[0].value
    proposed = fams["disaggsdk_spec_decode_num_draft_tokens"].samples[0].value
    assert 0 < accepted <= proposed
    per_pos = {s.labels["position"]: s.value for s in fams["disaggsdk_spec_decode_num_accepted_tokens_per_pos"].samples
               if s.name.endswith("_total")}
    assert set(per_pos) == {"0", "1"} and sum(per_pos.values()) == accepted
