"""Structured output in the engine: every output matches its JSON Schema, regex or choice, with
speculative decoding on and off (greedy tokens equal; drafts accepted), completed grammars end the
request, and bad constraints are refused with what is wrong."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.speculative.config import SpeculativeConfig  # noqa: E402
from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402
from tests.structured_schemas import random_schemas  # noqa: E402

SCHEMAS = random_schemas(12, seed=1)
PROMPT = "# a JSON record\nrecord = "
CONFIG = dict(num_pages=256, page_size=4, max_num_batched_tokens=64)


def run(model: str, outputs: list[StructuredOutput], spec: SpeculativeConfig | None, temperature: float = 0.0):
    tok = load_tokenizer(model)
    prompt = tok.encode(PROMPT)
    params = [SamplingParams(max_tokens=160, structured=o, temperature=temperature, seed=i)
              for i, o in enumerate(outputs)]
    with LLMEngine(model, EngineConfig(**CONFIG, speculative=spec)) as engine:
        outs = engine.generate([prompt] * len(outputs), params)
        assert engine.kv.num_free_pages == CONFIG["num_pages"]
        return [tok.decode(o.output_ids) for o in outs], [o.finish_reason for o in outs], engine.spec_stats


@pytest.mark.parametrize("model,spec", [
    ("deepseek-r1-tiny", None), ("deepseek-r1-tiny", SpeculativeConfig("mtp", 3)),
    ("qwen3-coder-tiny", SpeculativeConfig("ngram", 3)),
], ids=["plain", "mtp-k3", "ngram-k3"])
def test_every_output_validates_against_its_schema(model, spec):
    texts, reasons, stats = run(model, [StructuredOutput.json_schema(s) for s in SCHEMAS], spec)
    for text, schema, reason in zip(texts, SCHEMAS, reasons):
        jsonschema.validate(json.loads(text), schema)
        assert reason == "stop"  # the grammar completed; never cut by max_tokens
    if spec is not None:
        assert stats.num_accepted_tokens > 0  # drafts were checked against the grammar and kept
        plain, _, _ = run(model, [StructuredOutput.json_schema(s) for s in SCHEMAS], None)
        assert texts == plain  # greedy: speculation changes nothing


def test_sampled_outputs_validate_too():
    texts, _, _ = run("deepseek-r1-tiny", [StructuredOutput.json_schema(s) for s in SCHEMAS[:6]],
                      SpeculativeConfig("mtp", 2), temperature=1.0)
    for text, schema in zip(texts, SCHEMAS):
        jsonschema.validate(json.loads(text), schema)


def test_regex_choice_and_json_object():
    outputs = [StructuredOutput("regex", r"[a-z]{2,5}_[0-9]{2}"), StructuredOutput.choice(["yes", "no", "maybe"]),
               StructuredOutput("json_object")]
    texts, reasons, _ = run("qwen3-coder-tiny", outputs, None)
    import re

    assert re.fullmatch(r"[a-z]{2,5}_[0-9]{2}", texts[0])
    assert texts[1] in ("yes", "no", "maybe")
    assert isinstance(json.loads(texts[2]), dict) or reasons[2] == "length"


def test_bad_constraints_are_refused_naming_the_problem():
    with pytest.raises(StructuredOutputError, match="not one of json, json_object"):
        StructuredOutput("xml")
    with pytest.raises(StructuredOutputError, match="non-empty list of strings"):
        StructuredOutput.choice([])
    with LLMEngine("qwen3-coder-tiny", EngineConfig(num_pages=16)) as engine:
        with pytest.raises(StructuredOutputError, match="structured output regex"):
            engine.add_request("r", [1, 2], SamplingParams(structured=StructuredOutput("regex", "(unclosed")))
        with pytest.raises(StructuredOutputError, match="structured output json: the schema cannot be used"):
            engine.add_request("s", [1, 2], SamplingParams(structured=StructuredOutput("json", "{not json")))
        assert not engine.has_unfinished() and engine.kv.num_free_pages == 16


def test_a_grammar_that_cannot_continue_ends_the_request_with_the_reason(monkeypatch):
    from disaggsdk.engine.structured.grammar import GrammarState

    monkeypatch.setattr(GrammarState, "accept", lambda self, token: False)  # a dead end, forced
    with LLMEngine("qwen3-coder-tiny", EngineConfig(num_pages=16)) as engine:
        engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=8, structured=StructuredOutput("regex", "a+")))
        outs = []
        while engine.has_unfinished():
            outs += engine.step()
        last = outs[-1]
        assert last.finished and last.finish_reason == "error" and "grammar cannot continue" in last.error
        assert last.output_ids == []  # the refused token was not emitted
        assert engine.kv.num_free_pages == 16
