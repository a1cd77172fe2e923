"""--served-model-name / serve.model_name: clients use the served name, the checkpoint's tokenizer and
template still apply, and a bad name in a spec is refused with its YAML path."""

from __future__ import annotations

import httpx
import pytest

from disaggsdk import SpecError
from disaggsdk.spec import parse_spec_yaml


def test_the_served_name_is_what_clients_use():
    from disaggsdk.engine.llm_engine import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=64), served_model_name="acme/coder") as d:
        assert d.model_name == "acme/coder"
        (entry,) = httpx.get(f"{d.url}/v1/models").json()["data"]
        assert entry["id"] == "acme/coder" and entry["chat_template"] == "checkpoint"
        ok = httpx.post(f"{d.url}/v1/chat/completions", json={
            "model": "acme/coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["model"] == "acme/coder"
        other = httpx.post(f"{d.url}/v1/completions", json={"model": "qwen3-coder-tiny", "prompt": "x"})
        assert other.status_code == 404 and "acme/coder" in other.json()["error"]["message"]


def test_a_bad_served_name_in_a_spec_names_its_path():
    with pytest.raises(SpecError, match=r"\$\.serve\.model_name.*without spaces"):
        parse_spec_yaml("model: qwen3-coder-tiny\nserve:\n  model_name: 'my model'\n", source="s.yaml")
