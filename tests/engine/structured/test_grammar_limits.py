"""What a server admits, a unit can build (issue 33): the byte and symbol limits, a panicking
llguidance and a slow compile are each one request's error, found before admission and quickly."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("llguidance")

from disaggsdk.engine.structured import grammar
from disaggsdk.engine.structured.grammar_compiler import GrammarCompiler
from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError

MODEL = "qwen3-coder-tiny"


def probe_choice(count: int = 70_000) -> StructuredOutput:
    """The probe's request: ``count`` distinct strings (70,000 of them: 1.4 MB as JSON here, 689 KB
    in the probe), whose matcher llguidance could not build (``assertion failed:
    grammar.symbols.len() < u16::MAX as usize - 10``) after its validation had passed."""
    return StructuredOutput.choice([f"option number {i}" for i in range(count)])


def test_the_probes_choice_list_is_refused_at_once_naming_the_limit():
    # refused for its size, before llguidance sees it (it compiled for 7 s, then validated, before)
    with pytest.raises(StructuredOutputError, match=f"over the limit of {grammar.MAX_GRAMMAR_BYTES} bytes"):
        grammar.check_structured(MODEL, probe_choice())


def test_what_the_check_refuses_the_engine_refuses_and_what_it_admits_the_engine_builds():
    tokenizer = grammar.ll_tokenizer(MODEL)
    with pytest.raises(StructuredOutputError, match="over the limit"):
        grammar.GrammarState(probe_choice(), tokenizer)
    fits = StructuredOutput.choice([f"c{i}" for i in range(5000)])  # a rule of 5,000 failed at the first token
    grammar.check_structured(MODEL, fits)
    state = grammar.GrammarState(fits, tokenizer)
    assert not state.is_finished and not state.matcher.is_error()


def test_a_grammar_over_the_symbol_limit_is_an_error_before_llguidance_asserts(monkeypatch):
    monkeypatch.setattr(grammar, "MAX_GRAMMAR_SYMBOLS", 100)  # the real limit needs ~60,000 symbols
    with pytest.raises(StructuredOutputError, match="structured output grammar: .*too big"):
        rule = "start: " + " | ".join(f'"s{i}"' for i in range(300))  # a symbol per alternative
        grammar.build_matcher(StructuredOutput("grammar", rule), grammar.ll_tokenizer(MODEL))


class PanicException(BaseException):
    """What pyo3 raises when Rust code panics: a BaseException, so `except Exception` misses it."""


class PanickingMatcher:
    def __init__(self, *_args, **_kwargs):
        raise PanicException("assertion failed: grammar.symbols.len() < u16::MAX as usize - 10")


def test_a_panic_while_building_is_the_requests_error(monkeypatch):
    import llguidance

    PanickingMatcher.grammar_from_regex = staticmethod(llguidance.LLMatcher.grammar_from_regex)
    monkeypatch.setattr(llguidance, "LLMatcher", PanickingMatcher)
    with pytest.raises(StructuredOutputError, match="cannot be built \\(PanicException: assertion failed"):
        grammar.build_matcher(StructuredOutput("regex", "panics[0-9]"), grammar.ll_tokenizer(MODEL))


def test_a_servers_check_waits_a_tenth_of_a_second_then_leaves_the_build_to_the_unit(monkeypatch):
    from disaggsdk.engine.structured import grammar_compiler

    release, building = threading.Event(), threading.Event()

    def build_until_released(output, tokenizer):
        building.set()
        release.wait(60)

    monkeypatch.setattr(grammar_compiler, "build_matcher", build_until_released)
    compiler = GrammarCompiler(MODEL)
    try:
        compiler.check(StructuredOutput("regex", "slow"))  # admitted: not refused, not waited for
        assert building.is_set() and not release.is_set()  # it returned while the build still ran
    finally:
        release.set()
        compiler.close()
