"""/metrics passes `promtool check metrics`-style linting (tests/serve/promlint.py), carries vLLM's
names and meanings, and the linter itself catches what it should."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.records.unit_counters import UnitCounters
from disaggsdk.report.latency import RequestTimeline
from disaggsdk.serve.metrics import ServerMetrics, chunk_gaps_s, one_two_five_buckets
from tests.serve.promlint import lint

EVERY_FIELD = [  # every family gets samples: reasons, draft positions, preemptions
    InstanceStats("prefill-0", "prefill", kv_pages_used=3, kv_pages_total=12, counters=UnitCounters(
        transfer_bytes=4096, transfer_writes=8, transfer_s=0.25, transfer_failures=1,
        rejected_frames={"replayed": 2}, rejected_requests={"overloaded": 1})),
    InstanceStats("decode-0", "decode", running=2, waiting=1, kv_pages_used=25, kv_pages_total=100,
                  kv_grant_keys_open=7, counters=UnitCounters(
        exposed_transfer_s=0.01, requests_retried=1, spec_num_drafts=4, spec_num_draft_tokens=8,
        spec_num_accepted_tokens=5, spec_accepted_per_position=[3, 2], spec_drafts_per_position=[4, 4],
        num_preemptions=3)),
]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_a_served_deployments_metrics_pass_the_lint(deployment):
    url = deployment.url
    for i in range(2):
        body = {"prompt": f"lint {i}", "max_tokens": 5, "temperature": 0, "ignore_eos": True, "stream": bool(i)}
        assert httpx.post(f"{url}/v1/completions", json=body).status_code == 200
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "x", "max_tokens": 0}).status_code == 400
    text = httpx.get(f"{url}/metrics").text
    assert lint(text) == []
    fams = families(text)
    assert fams["disaggsdk_time_to_first_token_seconds"].samples  # traffic reached the histograms
    labels = {k for f in fams.values() for s in f.samples for k in s.labels}
    assert "engine" in labels and "instance" not in labels


def test_every_family_with_samples_passes_the_lint():
    metrics = ServerMetrics(lambda wait_s=0.0: EVERY_FIELD, "m", max_model_len=4096)
    metrics.record(RequestTimeline(0.0, [0.1, 0.2, 0.2, 0.4], prompt_tokens=30), "decode-0", "length")
    metrics.record(RequestTimeline(0.0, [], prompt_tokens=3), "", "error")
    text = metrics.exposition().decode()
    assert lint(text) == []
    fams = families(text)
    usage = {s.labels["engine"]: s.value for s in fams["disaggsdk_kv_cache_usage_perc"].samples}
    assert usage == {"prefill-0": 0.25, "decode-0": 0.25}
    capacity = {s.labels["engine"]: s.value for s in fams["disaggsdk_kv_pages_capacity"].samples}
    assert capacity == {"prefill-0": 12.0, "decode-0": 100.0}
    grants = {s.labels["engine"]: s.value for s in fams["disaggsdk_kv_grant_keys_open"].samples}
    assert grants == {"prefill-0": 0.0, "decode-0": 7.0}
    # every engine's scheduler counts preemptions: one sample each, 0 where none happened
    assert [(s.labels["engine"], s.value) for s in fams["disaggsdk_num_preemptions"].samples
            if s.name.endswith("_total")] == [("prefill-0", 0.0), ("decode-0", 3.0)]
    reasons = {s.labels["finished_reason"] for s in fams["disaggsdk_request_success"].samples}
    assert reasons == {"length", "error"}


def test_request_level_figures_mean_what_vllm_means():
    metrics = ServerMetrics(lambda wait_s=0.0: [], "m")
    # arrived at 0; first token at 0.1; two drafts accepted at 0.2 (one output); last at 0.4
    metrics.record(RequestTimeline(0.0, [0.1, 0.2, 0.2, 0.4], prompt_tokens=30), "decode-0", "length")
    fams = families(metrics.exposition().decode())

    def total(name: str, suffix: str) -> float:
        return next(s.value for s in fams[name].samples if s.name == name + suffix)

    # inter-token latency: one gap per output (0.1, 0.2), not a zero gap between the two drafts
    assert total("disaggsdk_inter_token_latency_seconds", "_count") == 2
    assert total("disaggsdk_inter_token_latency_seconds", "_sum") == pytest.approx(0.3)
    # TPOT per request: (e2e 0.4 - ttft 0.1) / (4 - 1)
    assert total("disaggsdk_request_time_per_output_token_seconds", "_count") == 1
    assert total("disaggsdk_request_time_per_output_token_seconds", "_sum") == pytest.approx(0.1)
    assert total("disaggsdk_request_decode_time_seconds", "_sum") == pytest.approx(0.3)
    assert total("disaggsdk_e2e_request_latency_seconds", "_sum") == pytest.approx(0.4)
    assert total("disaggsdk_request_prompt_tokens", "_sum") == 30
    assert total("disaggsdk_request_generation_tokens", "_sum") == 4
    assert total("disaggsdk_generation_tokens", "_total") == 4
    for old in ("disaggsdk_time_per_output_token_seconds", "disaggsdk_kv_pages_total", "disaggsdk_instance_healthy"):
        assert old not in fams


def test_the_lint_catches_each_rule():
    bad = "\n".join([
        "# HELP a_ms_total x", "# TYPE a_ms_total counter", 'a_ms_total{instance="i"} 1.0',
        "# HELP b_total x", "# TYPE b_total gauge", "b_total 1.0",
        "# TYPE c_latency gauge", "c_latency 1.0",
        "# HELP d_size x", "# TYPE d_size histogram",
        'd_size_bucket{le="2.0"} 1.0', 'd_size_bucket{le="1.0"} 2.0', 'd_size_bucket{le="+Inf"} 1.0',
        "d_size_count 3.0", "d_size_sum 1.0",
        "# HELP e:rule x", "# TYPE e:rule gauge", 'e:rule{job="j"} 1.0', "",
    ])
    problems = "\n".join(lint(bad))
    for expected in ("a_ms: use base units", "'instance' is Prometheus' own", "b_total: a gauge must not end",
                     "c_latency: no HELP", "c_latency: a time is in seconds", "d_size: a histogram's name ends",
                     "bucket bounds must increase", "bucket counts are cumulative", "!= the +Inf bucket",
                     "e:rule: metric names are snake_case", "'job' is Prometheus' own"):
        assert expected in problems, expected


def test_token_buckets_and_output_gaps():
    assert one_two_five_buckets(100) == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)
    assert one_two_five_buckets(4096)[-1] == 2000.0
    assert chunk_gaps_s([1.0, 1.5, 1.5, 1.5, 2.0]) == [0.5, 0.5]
    assert chunk_gaps_s([1.0]) == []
