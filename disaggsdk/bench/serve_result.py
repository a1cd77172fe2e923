"""vLLM ``bench serve``'s result document from streamed timelines (pure functions)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from disaggsdk.bench.stream_timeline import StreamTimeline
from disaggsdk.report.latency import METRICS

PERCENTILE_KEY = re.compile(r"p[\d.]+_(?P<metric>[a-z0-9_]+)_ms")


def per_request_lists(timelines: Sequence[StreamTimeline]) -> dict[str, list[Any]]:
    """vLLM's per-request lists, in request order (failed requests: zeros, empty lists, "")."""
    first_send_s = min(t.sent_s for t in timelines)
    return {
        "input_lens": [t.prompt_tokens for t in timelines],
        "output_lens": [t.output_tokens if t.ok else 0 for t in timelines],
        "ttfts": [t.ttft_ms / 1e3 if t.ok else 0.0 for t in timelines],
        "itls": [[x / 1e3 for x in t.itls_ms] if t.ok else [] for t in timelines],
        "latencies": [t.latency_s for t in timelines],
        "start_times": [t.sent_s for t in timelines],  # perf_counter seconds, as vLLM's
        "generated_texts": [t.generated_text for t in timelines],
        "errors": [t.error or "" for t in timelines],
        "send_times_s": [t.sent_s - first_send_s for t in timelines],  # ours: a trace for `disaggsdk simulate`
    }


def cached_token_counts(timelines: Sequence[StreamTimeline]) -> dict[str, float | int]:
    """``total_cached_tokens`` and ``cached_token_ratio`` (over ``total_input_tokens``) of the
    completed requests, when any of them carried ``usage.prompt_tokens_details.cached_tokens``;
    nothing otherwise, so a server that does not report them leaves vLLM's keys as they were."""
    done = [t for t in timelines if t.ok]
    if all(t.cached_tokens is None for t in done):
        return {}
    cached = sum(t.cached_tokens or 0 for t in done)
    input_tokens = sum(t.prompt_tokens for t in done)
    return {"total_cached_tokens": cached, "cached_token_ratio": cached / input_tokens if input_tokens else 0.0}


def per_second_peaks(timelines: Sequence[StreamTimeline]) -> dict[str, float | int]:
    """``max_output_tokens_per_s`` and ``max_concurrent_requests`` as vLLM computes them.

    vLLM buckets the run into whole seconds from the first successful send: a request is
    concurrent in every second from its send to its last chunk (both ends included), and
    "tokens" are its chunks (TTFT plus each ITL), so both peaks follow the chunk count.
    """
    done = [t for t in timelines if t.ok]
    if not done:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start_s = min(t.sent_s for t in done)
    num_seconds = int(math.ceil(max(t.sent_s + t.latency_s for t in done) - start_s)) + 1
    chunks = [0] * num_seconds
    concurrent = [0] * num_seconds
    for t in done:
        for chunk_s in t.token_times_s:
            second = int(chunk_s - start_s)
            if 0 <= second < num_seconds:
                chunks[second] += 1
        for second in range(int(t.sent_s - start_s), int(t.sent_s + t.latency_s - start_s) + 1):
            concurrent[second] += 1
    return {"max_output_tokens_per_s": float(max(chunks)), "max_concurrent_requests": max(concurrent)}


def keep_percentiles_of(summary: dict[str, Any], metrics: Iterable[str]) -> dict[str, Any]:
    """``summary`` without the percentile keys of metrics not in ``metrics``.

    Raises:
        ValueError: a metric outside ttft, tpot, itl, e2el.
    """
    metrics = set(metrics)
    unknown = metrics - set(METRICS)
    if unknown:
        raise ValueError(f"unknown metric {sorted(unknown)}; use {', '.join(METRICS)}")
    out = {}
    for key, value in summary.items():
        match = PERCENTILE_KEY.fullmatch(key)
        if match and match["metric"] in METRICS and match["metric"] not in metrics:
            continue
        out[key] = value
    return out


def result_filename(backend: str, request_rate: float, max_concurrency: int | None, model: str,
                    date: str) -> str:
    """vLLM's default name for a saved result, e.g. ``openai-2.0qps-concurrency8-qwen3-20260101-120000.json``."""
    concurrency = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
    return f"{backend}-{float(request_rate)}qps{concurrency}-{model.split('/')[-1]}-{date}.json"
