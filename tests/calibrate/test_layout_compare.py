"""Which layouts a comparison runs, here and at the target's scale; its simulated sweeps; the plots."""

from __future__ import annotations

import pytest

from disaggsdk.bench.dataset import BenchRequest
from disaggsdk.bench.goodput_sweep import RateSweep
from disaggsdk.bench.serve_bench import LoadShape, arrival_gaps_s
from disaggsdk.calibrate.layout_compare import (
    CompareError,
    machine_layouts,
    machine_spec,
    recommend,
    sim_requests,
    target_goodput,
    target_layouts,
)
from disaggsdk.records.goodput_records import LayoutGoodput
from disaggsdk.spec import load_spec

QWEN = load_spec("specs/qwen3_coder.yaml")
R1_DP = load_spec("specs/r1_dp.yaml")
SLOS = {"ttft": 2000.0, "tpot": 100.0}


def test_this_machine_runs_colocated_each_split_of_its_cores_and_conditional():
    here = machine_spec(QWEN)
    assert (here.model, here.device, here.prefill.tp, here.decode.replicas) == ("qwen3-coder-tiny", "cpu", 1, 1)
    two = machine_layouts(here, 2, local_prefill_tokens=256)
    assert [(lay.name, lay.kind) for lay in two] == [
        ("colocated", "colocated"), ("P1:D1", "disaggregated"),
        ("conditional P1:D1 (<= 256 tokens on decode)", "conditional")]
    assert two[0].colocated and two[0].spec.prefill.replicas + two[0].spec.decode.replicas == 2
    assert two[2].spec.transfer.max_local_prefill_tokens == 256 and two[1].spec.transfer.max_local_prefill_tokens == 0
    four = machine_layouts(here, 4)
    assert [lay.name for lay in four][1:4] == ["P1:D3", "P2:D2", "P3:D1"]
    assert all(lay.spec.hardware.gpus_per_node == 4 for lay in four)
    with pytest.raises(CompareError, match="2 cores"):
        machine_layouts(here, 1)
    with pytest.raises(CompareError, match="device: cpu"):
        machine_layouts(QWEN, 2)


def test_the_target_splits_its_instances_where_they_are_alike_and_keeps_its_own_ratio_otherwise():
    assert [lay.name for lay in target_layouts(QWEN, 512)] == [
        "colocated", "P1:D3", "P2:D2", "P3:D1", "conditional P1:D3 (<= 512 tokens on decode)"]
    # R1's prefill is tp 8 with ep, its decode dp 8: a split would change the GPUs, so only its own ratio
    assert [lay.name for lay in target_layouts(R1_DP, 512)] == [
        "colocated", "P1:D1", "conditional P1:D1 (<= 512 tokens on decode)"]


def test_a_simulated_run_sees_the_very_arrivals_bench_sends():
    reqs = [BenchRequest([1] * n, n, 4) for n in (10, 20, 30)]
    sim = sim_requests(reqs, rate=2.0, seed=5)
    gaps = arrival_gaps_s(LoadShape(qps=2.0, seed=5), 3)
    assert [r.arrival_s for r in sim] == pytest.approx([0.0, gaps[0], gaps[0] + gaps[1]])
    assert [(r.input_len, r.output_len) for r in sim] == [(10, 4), (20, 4), (30, 4)]
    assert all(r.arrival_s == 0 for r in sim_requests(reqs, rate=float("inf"), seed=5))


def _lengths(seed: int, n: int) -> list[BenchRequest]:
    import random

    rng = random.Random(seed)
    return [BenchRequest([0], rng.choice((200, 1200)), rng.randint(32, 128)) for _ in range(n)]


def test_the_target_sweep_finds_each_layouts_goodput_and_recommends_the_best_with_its_reason():
    result = target_goodput(QWEN, _lengths, RateSweep(search_steps=3), SLOS, num_requests=200)
    assert result["profile"] == "h200" and len(result["layouts"]) == 5
    for layout in result["layouts"]:
        sweep = layout["simulated"]
        assert layout["measured"] is None and layout["goodput_request_rate"] == sweep["goodput_request_rate"] > 0
        assert sweep["sweep"][0]["request_rate"] == "inf" and "slo_attainment" in sweep["sweep"][0]
    best = max(result["layouts"], key=lambda r: r["goodput_request_rate"])
    assert result["recommendation"].startswith(f"qwen3-coder on h200 (simulated): {best['layout']}, ")


def _goodput(name: str, rate: float, limited: bool, rounds: tuple[float, ...] = ()) -> LayoutGoodput:
    rounds = rounds or (rate,)
    sweep = {"goodput_request_rate": rate, "sweep": [], "goodput_rounds": list(rounds),
             "goodput_range": [min(rounds), max(rounds)],
             "limited_by": {"request_rate": 3.0, "slo": "tpot", "missed_share": 0.25, "ttft_phase": None}
             if limited else None}
    return LayoutGoodput(layout=name, kind="disaggregated", where="here", measured=sweep,  # type: ignore[typeddict-item]
                         simulated=sweep, goodput_request_rate=rate, simulated_error=None,  # type: ignore[typeddict-item]
                         sim_slowdown=None, sim_fitted_on=[])


def test_each_layout_is_simulated_at_the_slowdown_the_other_layouts_flat_out_runs_showed():
    from disaggsdk.calibrate.layout_compare import leave_one_out_slowdowns

    assert leave_one_out_slowdowns([1.1, 1.2, 1.3]) == [
        (pytest.approx((1.2 * 1.3) ** 0.5), [1, 2]), (pytest.approx((1.1 * 1.3) ** 0.5), [0, 2]),
        (pytest.approx((1.1 * 1.2) ** 0.5), [0, 1])]
    assert leave_one_out_slowdowns([1.4]) == [(1.0, [])]  # alone: nothing to calibrate on but its own runs
    assert leave_one_out_slowdowns([None, 1.2]) == [(1.2, [1]), (1.0, [])]


def test_the_recommendation_names_the_best_its_margin_and_what_limited_the_others():
    text = recommend([_goodput("colocated", 2.0, True), _goodput("P1:D1", 3.0, False)], "here")
    assert text == ("here: P1:D1, 3.00 req/s; 1.50x colocated's 2.00; one round each: --repeat 3 gives each layout "
                    "a range to tell close ones apart; colocated: limited by TPOT: 25% of requests missed it at "
                    "3.00 req/s")
    apart = recommend([_goodput("colocated", 2.0, True, (1.9, 2.0, 2.2)), _goodput("P1:D1", 3.0, False, (2.8, 3.0, 3.1))],
                      "here")
    assert "round" not in apart and "not told apart" not in apart
    close = recommend([_goodput("colocated", 2.9, True, (2.7, 2.9, 3.0)), _goodput("P1:D1", 3.0, False, (2.8, 3.0, 3.1))],
                      "here")
    assert "not told apart from colocated: their rounds' ranges overlap (2.80-3.10 and 2.70-3.00 req/s)" in close
    assert "no layout met the SLOs" in recommend([_goodput("colocated", 0.0, True)], "here")


def test_the_plots_draw_a_comparison_and_save_as_png_svg_or_html(tmp_path):
    from disaggsdk.face.compare import LayoutComparison

    target = target_goodput(QWEN, _lengths, RateSweep(search_steps=2), SLOS, num_requests=100)
    here = [dict(layout, measured=layout["simulated"], where="this machine", simulated_error=0.05, sim_slowdown=1.1)
            for layout in target["layouts"][:2]]
    result = LayoutComparison({"slos_ms": SLOS, "slo_attainment_target": 0.9, "machine_spec": "tiny",  # type: ignore[typeddict-item]
                               "profile": "cpu-local", "this_machine": here, "recommendation": recommend(here, "here"),
                               "targets": [target]})
    fig = result.figure()
    assert len(fig.axes) == 4 and all(ax.lines for ax in fig.axes)
    for suffix in ("png", "svg", "html"):
        path = result.save_plot(tmp_path / f"compare.{suffix}")
        assert path.stat().st_size > 1000
    page = (tmp_path / "compare.html").read_text()
    assert "data:image/png;base64," in page and "+5%" in page and "P1:D3" in page
    assert "<table>" in result._repr_html_() and len(result.rows()) == 7
    with pytest.raises(ValueError, match=".png, .svg, .html"):
        result.save_plot(tmp_path / "compare.pdf")
