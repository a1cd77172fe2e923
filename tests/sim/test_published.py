"""The published figures and how `simulate --published` judges them (`disaggsdk.sim.published`, `published_run`).

The whole command runs in tests/docs/test_published_page.py (its JSON, every case); these are the parts.
"""

from __future__ import annotations

import pytest

from disaggsdk.errors import SpecError
from disaggsdk.models import resolve_model
from disaggsdk.plan.memory import spec_memory_problems
from disaggsdk.sim.kernels import KERNEL_KINDS
from disaggsdk.sim.published import (
    CASES,
    Citation,
    ConcurrencySweep,
    GoodputGain,
    PhaseSteps,
    PublishedFigure,
    ServingLoad,
    TokensPerRequest,
    TtftPenalty,
    case_names,
)
from disaggsdk.sim.published_run import published_specs_dir, run_case, select_cases
from disaggsdk.spec import load_spec

CITE = Citation("a post", "https://example.org", "2025", "its table")


def figure(value: float, comparison: str) -> PublishedFigure:
    return PublishedFigure("m", "tok/s", value, comparison, "as said", CITE, TtftPenalty())  # type: ignore[arg-type]


def test_a_number_holds_within_25_percent_and_its_error_is_relative():
    about = figure(100.0, "about")
    assert about.error(125.0) == pytest.approx(0.25) and about.holds(125.0) and about.holds(75.0)
    assert not about.holds(125.1) and not about.holds(74.9)
    assert about.error(None) is None and not about.holds(None)


def test_a_claim_holds_on_its_side_and_has_no_error():
    above, below = figure(90.0, "above"), figure(50.0, "below")
    assert above.holds(90.1) and not above.holds(90.0) and not above.holds(10.0)
    assert below.holds(49.9) and not below.holds(50.0) and not below.holds(150.0)
    assert above.error(144.0) is None and below.error(20.0) is None


def test_cases_are_named_uniquely_and_selected_by_name():
    assert len(set(case_names())) == len(CASES) == 4
    assert [c.name for c in select_cases(None)] == case_names()
    assert [c.name for c in select_cases("seed-r1-dp8")] == ["seed-r1-dp8"]
    with pytest.raises(SpecError, match=r"no published case 'seed-r1-dp'; did you mean 'seed-r1-dp8'\? use one of "
                                        r"seed-r1-tp8, seed-r1-dp8, lmsys-r1-96xh100, dynamo-qwen3-32b-fp8"):
        select_cases("seed-r1-dp")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_case_has_a_valid_spec_that_fits_and_measures_what_its_workload_runs(case):
    folder = published_specs_dir()
    for file in filter(None, (case.spec, case.baseline_spec)):
        spec = load_spec(folder / file)  # validates
        assert spec_memory_problems(spec, resolve_model(spec.model)) == [], file
        assert spec.name is not None and spec.name.startswith(case.name), file
        assert (folder / file).read_text().startswith("# yaml-language-server: $schema=../../docs/spec.schema.json")
    measures = {type(f.measure) for f in case.figures}
    if isinstance(case.workload, ServingLoad):
        assert measures <= {TokensPerRequest, TtftPenalty}
    elif isinstance(case.workload, ConcurrencySweep):
        assert measures == {GoodputGain} and case.baseline_spec is not None
    else:
        assert isinstance(case.workload, PhaseSteps)
    for f in case.figures:
        assert f.citation.url and f.claim and f.unit


def test_the_phase_steps_take_the_sources_batch_and_name_every_kernel_kinds_source():
    lmsys = select_cases("lmsys-r1-96xh100")[0]
    prefill, decode = run_case(lmsys)  # one step each: fast
    assert "one prefill step of 256 prompts of 2,000 (8 a rank" in prefill.detail
    # the memory plan's KV pool (0.835 of an H100 after 4 experts' weights) holds fewer than 256 x 2,100 per rank
    assert decode.detail.startswith("one decode step of ") and "do not fit its KV pool" in decode.detail
    for result in (prefill, decode):
        assert result.simulated is not None and result.simulated > 0
        # measured tables where they cover the kernel, the profile's roofline where not (norms, embedding)
        assert set(result.sources) <= set(KERNEL_KINDS) and {"gemm", "mla_context", "rmsnorm"} <= set(result.sources)
        assert result.sources["gemm"].startswith("aiconfigurator-core ") and "h100_sxm/gemm/sglang" in result.sources["gemm"]
        assert result.sources["rmsnorm"].startswith("roofline (profile h100)")
        assert result.aiconfigurator is None  # the peer was not asked
        row = result.to_json()
        assert {"name", "metric", "published", "simulated", "error", "holds", "aiconfigurator", "sources"} <= set(row)
        assert row["error"] == pytest.approx(row["simulated"] / row["published"] - 1)
