"""--served-model-name / serve.model_name, and chat max_tokens defaulting to the rest of the context:
clients use the served name, the checkpoint's tokenizer and
template still apply, and a bad name in a spec is refused with its YAML path."""

from __future__ import annotations

import httpx
import pytest

from disaggsdk import SpecError
from disaggsdk.spec import parse_spec_yaml


def test_the_served_name_is_what_clients_use():
    from disaggsdk.engine.config import EngineConfig
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


def test_chat_without_max_tokens_may_use_the_rest_of_the_context():
    from disaggsdk.serve.http.openai_request import parse_request, rest_of_context_by_default

    encode = lambda text: list(range(1, 11))  # noqa: E731 - every prompt is 10 tokens here
    chat = parse_request({"messages": [{"role": "user", "content": "hi"}]}, True, encode)
    assert rest_of_context_by_default(chat, 4096).params.max_tokens == 4086
    assert rest_of_context_by_default(chat, None).params.max_tokens == 256  # context unknown: the old default
    given = parse_request({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}, True, encode)
    assert rest_of_context_by_default(given, 4096).params.max_tokens == 7
    completion = parse_request({"prompt": "x"}, False, encode)
    assert rest_of_context_by_default(completion, 4096).params.max_tokens == 16  # OpenAI's legacy default
