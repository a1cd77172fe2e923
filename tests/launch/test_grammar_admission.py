"""A unit's structured requests wait for their grammars off the unit's loop: a grammar that does not
build, or builds too slowly, is that request's error; one that builds is handed back to be admitted."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("llguidance")

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.engine.structured.output import StructuredOutput
from disaggsdk.launch import messages as ch
from disaggsdk.launch.unit_process.grammar_admission import GrammarAdmission

MODEL = "qwen3-coder-tiny"


def generate(rid: str, output: StructuredOutput | None) -> ch.Generate:
    return ch.Generate(rid, [1, 2, 3], SamplingParams(max_tokens=4, structured=output))


def ready_within(admission: GrammarAdmission, timeout_s: float) -> dict[str, str | None]:
    got: dict[str, str | None] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got |= {msg.request_id: error for msg, error in admission.ready()}
        time.sleep(0.01)
    return got


def test_requests_are_handed_back_with_their_grammars_outcome():
    admission = GrammarAdmission(MODEL)
    try:
        assert not admission.hold(generate("plain", None))  # no grammar: admitted at once
        assert admission.hold(generate("ok", StructuredOutput("regex", "[ab]{3}")))
        assert admission.hold(generate("bad", StructuredOutput("regex", "(unclosed")))
        big = StructuredOutput.choice([f"option number {i}" for i in range(70_000)])
        assert admission.hold(generate("probe", big))
        assert admission.hold(generate("dropped", StructuredOutput("regex", "[cd]{3}")))
        assert admission.abort("dropped") and not admission.abort("dropped")
        got = ready_within(admission, 1.5)
        assert set(got) == {"ok", "bad", "probe"} and got["ok"] is None
        assert "structured output regex" in got["bad"] and "over the limit" in got["probe"]
    finally:
        admission.close()


def test_a_build_past_the_time_limit_is_refused_when_the_limit_ends(monkeypatch):
    from disaggsdk.engine.structured import grammar_compiler

    release = threading.Event()  # the build runs until the test ends: the refusal cannot wait for it
    monkeypatch.setattr(grammar_compiler, "build_matcher", lambda output, tokenizer: release.wait(60))
    admission = GrammarAdmission(MODEL, time_limit_s=0.3)
    try:
        admission.hold(generate("slow", StructuredOutput("regex", "slow")))
        started_s = time.monotonic()
        while not (got := admission.ready()):
            time.sleep(0.01)
        assert time.monotonic() - started_s > 0.2  # not before the limit
        assert got[0][0].request_id == "slow" and "did not compile within 0.3 s" in got[0][1]
    finally:
        release.set()
        admission.close()
