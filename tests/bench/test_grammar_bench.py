"""The structured-output cost benchmark runs and reports both runs and the grammar's own time."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("llguidance")

from disaggsdk.bench.grammar_bench import run_grammar_bench


def test_grammar_bench_reports_the_step_with_and_without_constraints():
    result = run_grammar_bench("qwen3-coder-tiny", batch=2, steps=4)
    assert result["constrained_requests"] == 1
    assert result["free_ms_per_step"] > 0 and result["mixed_ms_per_step"] > 0
    assert result["grammar_ms_per_step"] > 0  # the masks were computed: the constraint ran
