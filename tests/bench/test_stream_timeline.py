"""Chunk timing and the result document, as vLLM's `bench serve` computes them (pure, no server).

The scripted stream below is the one both clients were run against (vLLM 0.32's
`async_request_openai_completions` and ours): chunks at 100, 120, 150, 160 and 200 ms carrying
1, 1, 2, 1 and 3 tokens; both reported TTFT 100 ms, ITLs [20, 30, 10, 40] ms, latency 200 ms, 8 tokens.
"""

from __future__ import annotations

import pytest

from disaggsdk.bench.serve_result import keep_percentiles_of, per_request_lists, per_second_peaks, result_filename
from disaggsdk.bench.stream_timeline import StreamTimeline
from disaggsdk.report.latency import summarize

CHUNKS = [(0.100, 1), (0.120, 1), (0.150, 2), (0.160, 1), (0.200, 3)]  # (arrival s, tokens)


def scripted(chat: bool, sent_s: float = 0.0, usage: bool = True) -> StreamTimeline:
    t = StreamTimeline(sent_s, prompt_tokens=5)
    for at_s, n in CHUNKS:
        choice = {"delta": {"content": "x" * n}} if chat else {"text": "x" * n, "token_ids": list(range(n))}
        t.add_chunk({"choices": [choice]}, chat, sent_s + at_s)
    if usage:
        t.add_chunk({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 8}}, chat, sent_s + 0.3)
    return t


@pytest.mark.parametrize("chat", [False, True])
def test_one_itl_per_chunk_and_vllms_tpot(chat):
    t = scripted(chat)
    assert t.ok and t.ttft_ms == pytest.approx(100) and t.latency_s == pytest.approx(0.2)
    assert t.itls_ms == pytest.approx([20, 30, 10, 40])  # 4 gaps for 5 chunks, not 7 for 8 tokens
    assert t.output_tokens == 8 and t.prompt_tokens == 7  # the usage chunk, which adds no time
    assert t.tpot_ms == pytest.approx((200 - 100) / (8 - 1))
    assert t.generated_text == "x" * 8


def test_output_length_without_usage_comes_from_token_ids_then_chunks():
    assert scripted(chat=False, usage=False).output_tokens == 8  # our server's token_ids
    assert scripted(chat=True, usage=False).output_tokens == 5  # nothing better than one per chunk


def test_an_error_event_fails_the_request():
    t = StreamTimeline(0.0)
    t.add_chunk({"error": {"message": "boom"}}, chat=False, now_s=0.1)
    assert not t.ok and t.error == "boom" and t.latency_s == 0.0


def test_result_lists_and_summary_follow_vllm():
    ok, failed = scripted(False, sent_s=10.0), StreamTimeline(10.5, prompt_tokens=3, error="HTTP 400: no")
    lists = per_request_lists([ok, failed])
    assert lists["ttfts"] == pytest.approx([0.1, 0.0]) and lists["itls"][1] == [] and lists["output_lens"] == [8, 0]
    assert lists["latencies"] == pytest.approx([0.2, 0.0]) and lists["start_times"] == [10.0, 10.5]
    assert lists["errors"] == ["", "HTTP 400: no"] and lists["send_times_s"] == [0.0, 0.5]
    summary = summarize([ok, failed], 1.0, (50, 99))
    assert summary["completed"] == 1 and summary["failed"] == 1 and summary["total_output_tokens"] == 8
    assert summary["mean_itl_ms"] == pytest.approx(25) and summary["mean_e2el_ms"] == pytest.approx(200)


def test_per_second_peaks_bucket_whole_seconds_from_the_first_send():
    a, b, c = scripted(False, 0.0), scripted(False, 0.5), scripted(False, 1.9)  # b ends at 0.7, c at 2.1
    peaks = per_second_peaks([a, b, c])
    assert peaks == {"max_output_tokens_per_s": 10.0, "max_concurrent_requests": 2}  # 5 chunks each in second 0
    assert per_second_peaks([StreamTimeline(0.0, error="x")]) == {"max_output_tokens_per_s": 0.0,
                                                                  "max_concurrent_requests": 0}


def test_percentile_keys_only_for_the_metrics_asked():
    summary = summarize([scripted(False)], 1.0, (50, 99.9))
    kept = keep_percentiles_of(summary, ["ttft", "e2el"])
    assert "p99.9_ttft_ms" in kept and "p50_e2el_ms" in kept and "p99.9_itl_ms" not in kept
    assert "mean_itl_ms" in kept and "median_tpot_ms" in kept  # means and medians stay
    with pytest.raises(ValueError, match="unknown metric"):
        keep_percentiles_of(summary, ["queue"])


def test_result_filename_is_vllms():
    assert result_filename("openai", float("inf"), None, "org/qwen3", "20260101-120000") == \
        "openai-infqps-qwen3-20260101-120000.json"
    assert result_filename("openai-chat", 2, 8, "m", "d") == "openai-chat-2.0qps-concurrency8-m-d.json"
