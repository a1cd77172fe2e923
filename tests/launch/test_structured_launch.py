"""Structured output through a disaggregated deployment with the official `openai` client: every
output of 50 generated JSON Schemas validates with `jsonschema`, with MTP speculation on and off
(greedy answers equal, drafts accepted), and json_object answers parse. The grammar runs on the
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
from disaggsdk.spec.types import Speculative  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402
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
        objects = [client.chat.completions.create(model=d.model_name, messages=MESSAGES, max_tokens=200,
                                                  temperature=t, seed=3, response_format={"type": "json_object"})
                   for t in (0.0, 1.0)]
        stats = d.backend.unit_stats()
    for o in objects:  # json_object: any JSON object (or cut by max_tokens, which it was not here)
        assert o.choices[0].finish_reason == "length" or isinstance(json.loads(o.choices[0].message.content), dict)
    return [t for t, _ in results], [r for _, r in results], stats


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
    assert sum(s.spec_num_accepted_tokens for s in decode) > 0  # drafts were made, masked and kept
