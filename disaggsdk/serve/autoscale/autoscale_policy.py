"""The SLO policy of `serve.autoscale`: from the served requests' TTFT and TPOT, which role is short."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsdk.serve.metrics import ServedRequest
    from disaggsdk.spec.serving import Autoscale

MIN_REQUESTS = 8  # fewer finished requests say too little about a layout to move a unit on


@dataclass(frozen=True)
class Layout:
    """How many units prefill and how many decode."""

    prefill: int
    decode: int

    def __str__(self) -> str:
        return f"P{self.prefill}:D{self.decode}"


@dataclass(frozen=True)
class WindowStats:
    """The window's requests against the SLOs (attainments are shares in [0, 1])."""

    num_requests: int
    ttft_attainment: float
    tpot_attainment: float
    rate_qps: float  # arrivals per second over the window's span
    mean_input_tokens: float
    mean_output_tokens: float


@dataclass(frozen=True)
class Proposal:
    """A role change the policy asks for, and why."""

    before: Layout
    after: Layout
    reason: str


def recent_window(served: list[ServedRequest], now_s: float, config: Autoscale,
                  since_s: float = 0.0) -> list[ServedRequest]:
    """The requests that ended in ``[now_s - window_s, now_s]`` and arrived at or after ``since_s``
    (``time.monotonic()`` seconds): what the layout in place served lately."""
    return [r for r in served if r.ended_s >= now_s - config.window_s and r.timeline.sent_s >= since_s]


def window_stats(window: list[ServedRequest], config: Autoscale, overdue: int = 0) -> WindowStats:
    """The SLO attainment of ``window`` (`recent_window`), with ``overdue`` queued requests (no first token
    past the TTFT SLO) counted as TTFT misses. A request that failed meets neither SLO; one token only has
    no TPOT and meets it."""
    if not window:
        return WindowStats(overdue, 0.0 if overdue else 1.0, 1.0, 0.0, 0.0, 0.0)
    ttft_met = tpot_met = 0
    for r in window:
        t = r.timeline
        if not t.ok or not t.token_times_s:
            continue
        ttft_met += t.ttft_ms <= config.ttft_ms
        tpot_met += t.tpot_ms is None or t.tpot_ms <= config.tpot_ms
    sent = [r.timeline.sent_s for r in window]
    span_s = max(sent) - min(sent)
    n = len(window)
    return WindowStats(n + overdue, ttft_met / (n + overdue), tpot_met / n, (n - 1) / span_s if span_s > 0 else 0.0,
                       sum(r.timeline.prompt_tokens for r in window) / n,
                       sum(r.timeline.output_tokens for r in window) / n)


def propose(stats: WindowStats, layout: Layout, config: Autoscale) -> Proposal | None:
    """The change the window asks for (see the module doc), or None."""
    if stats.num_requests < MIN_REQUESTS:
        return None
    target = config.attainment
    ttft_ok, tpot_ok = stats.ttft_attainment >= target, stats.tpot_attainment >= target
    seen = (f"TTFT attainment {stats.ttft_attainment:.0%}, TPOT {stats.tpot_attainment:.0%} over "
            f"{stats.num_requests} requests (target {target:.0%}; TTFT <= {config.ttft_ms:g} ms, "
            f"TPOT <= {config.tpot_ms:g} ms)")
    if not ttft_ok and tpot_ok and layout.decode > config.min_decode:
        return Proposal(layout, Layout(layout.prefill + 1, layout.decode - 1), f"prefill is short: {seen}")
    if not tpot_ok and ttft_ok and layout.prefill > config.min_prefill:
        return Proposal(layout, Layout(layout.prefill - 1, layout.decode + 1), f"decode is short: {seen}")
    return None
