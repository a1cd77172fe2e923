"""Constraints no output can match (issue 55 finding 5): refused when the matcher is built when
llguidance's first mask shows it (a schema that only refers to itself, a $ref cycle, a pattern no
string matches), and a grammar that dead-ends later ends its request with an error, never with
``finish_reason: stop`` (its mask then allows only the eos, which completed such requests before)."""

from __future__ import annotations

import pytest

pytest.importorskip("llguidance")

from disaggsdk.engine.structured import grammar
from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError

MODEL = "qwen3-coder-tiny"
EMPTY = {
    "schema refers to itself": StructuredOutput.json_schema({"$ref": "#"}),
    "$ref cycle": StructuredOutput.json_schema({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                                "$ref": "#/$defs/a"}),
    "class matching nothing": StructuredOutput("regex", r"[^\s\S]"),
    "empty intersection": StructuredOutput("regex", "[a&&b]"),
    "codepoint past unicode": StructuredOutput("regex", r"x[^\x00-\U0010ffff]"),
    "lark rule only recursing": StructuredOutput("grammar", 'start: a\na: a "x"'),
    "lark terminal matching nothing": StructuredOutput("grammar", "start: A\nA: /[^\\s\\S]/"),
}


@pytest.mark.parametrize("output", EMPTY.values(), ids=EMPTY.keys())
def test_a_constraint_no_output_can_match_is_refused_before_admission(output):
    with pytest.raises(StructuredOutputError, match="no output can match it"):
        grammar.check_structured(MODEL, output)
    with pytest.raises(StructuredOutputError, match="no output can match it"):  # and a unit will not build it
        grammar.GrammarState(output, grammar.ll_tokenizer(MODEL))


@pytest.mark.parametrize("output", [StructuredOutput("regex", ""), StructuredOutput("regex", "a{0}"),
                                    StructuredOutput.json_schema({}), StructuredOutput.choice([""])],
                         ids=["empty pattern", "a{0}", "any JSON", "the empty choice"])
def test_a_constraint_only_the_empty_text_or_anything_matches_is_admitted(output):
    grammar.check_structured(MODEL, output)


def test_a_grammar_that_dead_ends_after_a_token_ends_with_an_error_not_stop():
    pytest.importorskip("torch")
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams

    dead_end = StructuredOutput("grammar", 'start: "a" b\nb: b "x"')  # "a", then a rule that never ends
    grammar.check_structured(MODEL, dead_end)  # its first mask allows "a": admitted
    with LLMEngine(MODEL, EngineConfig(num_pages=16)) as engine:
        engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=8, structured=dead_end))
        outs = []
        while engine.has_unfinished():
            outs += engine.step()
        last = outs[-1]
        assert last.finished and last.finish_reason == "error", (last.finish_reason, last.output_ids)
        assert "grammar cannot continue: no token can extend it" in last.error
        assert engine.kv.num_free_pages == 16
