"""Latency and throughput of served requests, computed from timelines (pure functions).

Field names follow vLLM's ``bench serve`` results so existing dashboards and scripts read ours:
``mean_ttft_ms``, ``median_tpot_ms``, ``p99_itl_ms``, ``request_throughput``, ``request_goodput``...
Definitions (vLLM's): TTFT is arrival to first token; ITL the gaps between streamed tokens; TPOT
per request is (e2e latency - TTFT) / (output tokens - 1); E2EL arrival to last token. Display
(rich, the notebook dashboard) only renders these numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestTimeline:
    """What one request saw, in seconds on one monotonic clock."""

    sent_s: float
    token_times_s: list[float] = field(default_factory=list)  # arrival time of each output token
    prompt_tokens: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times_s)

    @property
    def output_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def ttft_ms(self) -> float:
        return (self.token_times_s[0] - self.sent_s) * 1e3

    @property
    def e2el_ms(self) -> float:
        return (self.token_times_s[-1] - self.sent_s) * 1e3

    @property
    def itls_ms(self) -> list[float]:
        t = self.token_times_s
        return [(b - a) * 1e3 for a, b in zip(t, t[1:])]

    @property
    def tpot_ms(self) -> float | None:
        """Mean time per output token after the first; None for single-token outputs."""
        if self.output_tokens < 2:
            return None
        return (self.e2el_ms - self.ttft_ms) / (self.output_tokens - 1)


def percentile(values: Sequence[float], p: float, weights: Sequence[float] | None = None) -> float:
    """Percentile ``p`` (0..100) of ``values``; 0.0 for no values.

    Unweighted: linear interpolation, as numpy's default. Weighted (each value counted
    ``weights[i]`` times, as the simulator records one step's inter-token latency for every
    request in the step): the smallest value whose cumulative weight reaches p%.
    """
    if not values:
        return 0.0
    if weights is None:
        xs = sorted(values)
        rank = (len(xs) - 1) * p / 100.0
        lo = int(rank)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)
    pairs = sorted(zip(values, weights))
    target = sum(weights) * p / 100.0
    cumulative = 0.0
    for value, weight in pairs:
        cumulative += weight
        if cumulative >= target:
            return value
    return pairs[-1][0]


def metric_stats(name: str, values: Sequence[float], percentiles: Iterable[float],
                 weights: Sequence[float] | None = None) -> dict[str, float]:
    """``mean_/median_/std_/pNN_{name}_ms`` of ``values`` (optionally weighted)."""
    if not values:
        out = {f"mean_{name}_ms": 0.0, f"median_{name}_ms": 0.0, f"std_{name}_ms": 0.0}
    elif weights is None:
        out = {f"mean_{name}_ms": statistics.fmean(values), f"median_{name}_ms": statistics.median(values),
               f"std_{name}_ms": statistics.pstdev(values)}
    else:
        total = sum(weights)
        mean = sum(v * w for v, w in zip(values, weights)) / total
        var = sum(w * (v - mean) ** 2 for v, w in zip(values, weights)) / total
        out = {f"mean_{name}_ms": mean, f"median_{name}_ms": percentile(values, 50, weights),
               f"std_{name}_ms": var ** 0.5}
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = percentile(values, p, weights)
    return out


SLO_NAMES = ("ttft", "tpot", "e2el")  # what an SLO may bound (ms)


def meets_slos(ttft_ms: float, tpot_ms: float | None, e2el_ms: float, slos_ms: dict[str, float]) -> bool:
    """Whether a finished request's latencies meet every SLO of ``slos_ms`` (keys among ttft, tpot,
    e2el; ms); a one-token answer has no TPOT, and meets any TPOT SLO. The simulator judges its
    requests with this too."""
    values = {"ttft": ttft_ms, "tpot": tpot_ms, "e2el": e2el_ms}
    return all((value := values[name]) is None or value <= limit for name, limit in slos_ms.items())


def is_good(t: RequestTimeline, slos_ms: dict[str, float]) -> bool:
    """Whether a request met every SLO (keys among ttft, tpot, e2el; values in ms)."""
    return t.ok and meets_slos(t.ttft_ms, t.tpot_ms, t.e2el_ms, slos_ms)


def summarize(timelines: Sequence[RequestTimeline], duration_s: float, percentiles: Iterable[float] = (50, 90, 99),
              slos_ms: dict[str, float] | None = None) -> dict[str, float | int]:
    """vLLM-compatible summary of a benchmark run.

    Args:
        timelines: every request sent, failed ones included.
        duration_s: wall time of the run (first send to last token).
        percentiles: which percentiles to report (``p99_ttft_ms``...).
        slos_ms: SLOs for goodput, e.g. ``{"ttft": 500, "tpot": 50}``; goodput is the rate of
            requests meeting all of them, ``slo_attainment`` their share of the requests sent, and
            ``slo_missed_<name>`` the share of the requests sent that missed that one (a failed one missed all).
    Returns:
        a flat dict of numbers.
    Raises:
        ValueError: an unknown SLO name or a non-positive duration.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be positive, got {duration_s}")
    slos_ms = dict(slos_ms or {})
    unknown = set(slos_ms) - set(SLO_NAMES)
    if unknown:
        raise ValueError(f"unknown SLO {sorted(unknown)}; use ttft, tpot or e2el (milliseconds)")
    percentiles = list(percentiles)
    done = [t for t in timelines if t.ok]
    tpots = [t.tpot_ms for t in done if t.tpot_ms is not None]
    output_tokens = sum(t.output_tokens for t in done)
    input_tokens = sum(t.prompt_tokens for t in done)
    result: dict[str, float | int] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(timelines) - len(done),
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(done) / duration_s,
        "output_throughput": output_tokens / duration_s,
        "total_token_throughput": (input_tokens + output_tokens) / duration_s,
    }
    if slos_ms:
        good = sum(is_good(t, slos_ms) for t in done)
        result["request_goodput"] = good / duration_s
        result["slo_attainment"] = good / len(timelines) if timelines else 0.0  # a failed request met none
        for name in slos_ms:  # which SLO kept requests out: the share of the requests sent that missed each
            result[f"slo_missed_{name}"] = sum(not is_good(t, {name: slos_ms[name]}) for t in timelines) / len(timelines) \
                if timelines else 0.0
    result |= metric_stats("ttft", [t.ttft_ms for t in done], percentiles)
    result |= metric_stats("tpot", tpots, percentiles)
    result |= metric_stats("itl", [x for t in done for x in t.itls_ms], percentiles)
    result |= metric_stats("e2el", [t.e2el_ms for t in done], percentiles)
    result["mean_tokens_per_s_per_request"] = tokens_per_s_per_request(tpots)
    return result


def tokens_per_s_per_request(tpots_ms: Sequence[float]) -> float:
    """Mean decode speed one request sees (1000 / TPOT): the number disaggregation is judged by."""
    speeds = [1e3 / x for x in tpots_ms if x > 0]
    return statistics.fmean(speeds) if speeds else 0.0
