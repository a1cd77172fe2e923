"""Chat prompts rendered from a checkpoint's own template equal what transformers'
`apply_chat_template` renders for the same messages and tools, for every trained checkpoint."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from disaggsdk.models.shipped import shipped_checkpoint  # noqa: E402
from disaggsdk.serve.http.chat_template import ChatTemplate, ChatTemplateError, load_chat_template  # noqa: E402

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}}
CONVERSATIONS = [
    ([{"role": "user", "content": "hi"}], None),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f():"},
      {"role": "assistant", "content": "pass"}, {"role": "user", "content": "more ünïcode <b>"}], None),
    ([{"role": "user", "content": "weather in Oslo?"}], TOOLS),
    ([{"role": "system", "content": "You help."}, {"role": "user", "content": "weather in Oslo?"},
      {"role": "assistant", "content": "", "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
      {"role": "tool", "tool_call_id": "call_2", "content": "12 C"}], TOOLS),
]


@pytest.mark.parametrize("model", ["qwen3-tiny", "qwen3-coder-tiny", "deepseek-r1-tiny"])
@pytest.mark.parametrize("case", range(len(CONVERSATIONS)))
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_rendering_equals_transformers(model, case, add_generation_prompt):
    directory = shipped_checkpoint(model)
    messages, tools = CONVERSATIONS[case]
    want = transformers.AutoTokenizer.from_pretrained(directory).apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt)
    got = load_chat_template(directory).render(messages, tools, add_generation_prompt)
    assert got == want


def test_string_arguments_are_parsed_as_vllm_does_and_errors_are_typed():
    template = load_chat_template(shipped_checkpoint("qwen3-coder-tiny"))
    as_text = {**CALL, "function": {"name": "get_weather", "arguments": json.dumps({"city": "Oslo", "days": 2})}}
    messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "", "tool_calls": [as_text]}]
    assert "<parameter=city>\nOslo\n</parameter>" in template.render(messages)
    failing = ChatTemplate("{{ raise_exception('roles must alternate') }}", {})
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        failing.render([{"role": "user", "content": "x"}])
    sandboxed = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(ChatTemplateError):
        sandboxed.render([{"role": "user", "content": "x"}])


def test_the_server_renders_chats_with_the_checkpoints_template(deployment):
    import httpx

    from tests.serve.conftest import SERVED_MODEL

    messages = CONVERSATIONS[1][0]
    directory = shipped_checkpoint(SERVED_MODEL)
    want = transformers.AutoTokenizer.from_pretrained(directory).apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    r = httpx.post(f"{deployment.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(want)
    (entry,) = httpx.get(f"{deployment.url}/v1/models").json()["data"]
    assert entry["chat_template"] == "checkpoint"
    r = httpx.post(f"{deployment.url}/v1/chat/completions",
                   json={"messages": messages, "chat_template_kwargs": [1], "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"
