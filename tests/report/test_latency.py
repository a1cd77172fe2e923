"""Latency accounting against hand-computed timelines."""

import pytest

from disaggsdk.report.latency import RequestTimeline, percentile, summarize


def test_one_request_by_hand():
    t = RequestTimeline(sent_s=10.0, token_times_s=[10.1, 10.15, 10.25], prompt_tokens=5)
    assert t.ttft_ms == pytest.approx(100)
    assert t.itls_ms == pytest.approx([50, 100])
    assert t.e2el_ms == pytest.approx(250)
    assert t.tpot_ms == pytest.approx(75)


def test_summary_has_vllm_field_names_and_values():
    ts = [
        RequestTimeline(0.0, [0.1, 0.2], prompt_tokens=4),
        RequestTimeline(1.0, [1.3, 1.4, 1.5], prompt_tokens=6),
        RequestTimeline(2.0, [], error="HTTP 500"),
    ]
    s = summarize(ts, duration_s=2.0, slos_ms={"ttft": 200})
    assert (s["completed"], s["failed"], s["total_input_tokens"], s["total_output_tokens"]) == (2, 1, 10, 5)
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["request_goodput"] == pytest.approx(0.5)  # only the first met TTFT <= 200 ms
    assert s["slo_missed_ttft"] == pytest.approx(2 / 3)  # the second was late, the failed one met nothing
    both = summarize(ts, duration_s=2.0, slos_ms={"ttft": 250, "tpot": 99})  # both TPOTs are 100 ms
    assert both["slo_missed_ttft"] == pytest.approx(2 / 3) and both["slo_missed_tpot"] == 1.0
    assert s["mean_ttft_ms"] == pytest.approx(200) and s["median_ttft_ms"] == pytest.approx(200)
    assert s["mean_tpot_ms"] == pytest.approx(100)
    assert s["p99_itl_ms"] == pytest.approx(100)
    assert s["mean_e2el_ms"] == pytest.approx((200 + 500) / 2)
    assert s["mean_tokens_per_s_per_request"] == pytest.approx(10.0)
    for key in ("std_ttft_ms", "p90_tpot_ms", "p50_e2el_ms", "output_throughput", "total_token_throughput"):
        assert key in s


def test_percentile_interpolates_like_numpy():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([], 99) == 0.0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown SLO"):
        summarize([], 1.0, slos_ms={"latency": 1})
    with pytest.raises(ValueError, match="duration_s must be positive"):
        summarize([], 0.0)


def test_weighted_percentile_counts_each_value_weight_times():
    values, weights = [10.0, 20.0, 30.0], [1, 1, 8]
    expanded = [10.0, 20.0] + [30.0] * 8
    assert percentile(values, 50, weights) == 30.0
    assert percentile(values, 10, weights) == 10.0
    from disaggsdk.report.latency import metric_stats

    weighted = metric_stats("itl", values, [99], weights)
    assert weighted["mean_itl_ms"] == pytest.approx(sum(expanded) / len(expanded))
    assert weighted["p99_itl_ms"] == 30.0
