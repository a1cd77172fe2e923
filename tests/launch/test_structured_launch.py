"""Structured output through a disaggregated deployment with the official `openai` client: every
output of 50 generated JSON Schemas validates with `jsonschema`, with MTP speculation on and off
(greedy answers equal, drafts accepted), json_object answers parse, and a tool-call round trip
(required call, tool result, answer) works streaming and not. The grammar runs on the
decode unit only; the prefill unit never sees it."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import attrs
import pytest

pytest.importorskip("torch")
pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from disaggsdk.face.deployment import launch  # noqa: E402
from disaggsdk.spec.engine_settings import Speculative  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402
from tests.serve.test_tool_calls import TOOLS  # noqa: E402
from tests.structured_schemas import random_schemas  # noqa: E402

SCHEMAS = random_schemas(50, seed=7)
MESSAGES = [{"role": "user", "content": "Give the record as JSON."}]


def answers(spec) -> tuple[list[str], list[str], dict]:
    with launch(spec, port=0, max_restarts=0) as d:
        client = openai.OpenAI(base_url=f"{d.url}/v1", api_key="unused", max_retries=0)

        def ask(schema: dict) -> tuple[str, str]:
            r = client.chat.completions.create(
                model=d.model_name, messages=MESSAGES, max_tokens=200, temperature=0,
                response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": schema,
                                                                        "strict": True}})
            return r.choices[0].message.content, r.choices[0].finish_reason

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(ask, SCHEMAS))
        round_trips = [tool_round_trip(client, d.model_name, stream) for stream in (False, True)]
        objects = [client.chat.completions.create(model=d.model_name, messages=MESSAGES, max_tokens=200,
                                                  temperature=t, seed=3, response_format={"type": "json_object"})
                   for t in (0.0, 1.0)]
        stats = d.backend.unit_stats()
    for o in objects:  # json_object: any JSON object (or cut by max_tokens, which it was not here)
        assert o.choices[0].finish_reason == "length" or isinstance(json.loads(o.choices[0].message.content), dict)
    assert all(round_trips)
    return [t for t, _ in results], [r for _, r in results], stats


def tool_round_trip(client, model: str, stream: bool) -> bool:
    """tools + tool_choice required -> a call; its result -> an answer (the decode unit runs the grammar)."""
    messages = [{"role": "user", "content": "What is the weather in Oslo for 3 days?"}]

    def ask(choice):
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice=choice,
                                           max_tokens=120, temperature=0, stream=stream)
        if not stream:
            return r.choices[0].message.content, r.choices[0].message.tool_calls, r.choices[0].finish_reason
        chunks = list(r)
        calls = [c for ch in chunks if ch.choices for c in (ch.choices[0].delta.tool_calls or [])]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        return text, calls, next(ch.choices[0].finish_reason for ch in reversed(chunks)
                                 if ch.choices and ch.choices[0].finish_reason)

    _, calls, reason = ask("required")
    assert reason == "tool_calls" and calls and isinstance(json.loads(calls[0].function.arguments), dict)
    messages.append({"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0].id, "type": "function",
         "function": {"name": calls[0].function.name, "arguments": calls[0].function.arguments}}]})
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 12 C"})
    answer, more, reason = ask("none")
    return bool(answer) and not more and reason in ("stop", "length")


def test_fifty_schemas_validate_with_speculation_on_and_off():
    base = make_spec("deepseek-r1-tiny", num_pages=512, budget=64)
    before = live_descendants()
    plain, reasons, _ = answers(base)
    spec_texts, _, stats = answers(attrs.evolve(base, speculative=Speculative("mtp", 2)))
    assert live_descendants() <= before
    for text, schema, reason in zip(spec_texts, SCHEMAS, reasons):
        jsonschema.validate(json.loads(text), schema)
        assert reason == "stop"
    assert spec_texts == plain  # greedy: the grammar and the drafts change nothing
    decode = [s for s in stats.values() if s.role == "decode"]
    assert sum(s.counters.spec_num_accepted_tokens for s in decode) > 0  # drafts were made, masked and kept
