"""Live per-instance numbers (pure): recent requests + instance snapshots -> rows and series.

The rich table and the notebook dashboard only render what these functions return.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from disaggsdk.report.latency import RequestTimeline, percentile, tokens_per_s_per_request

if TYPE_CHECKING:
    from disaggsdk.records.instance_stats import InstanceStats

DEFAULT_WINDOW_S = 30.0  # the live views summarise requests that ended this recently


class Served(Protocol):
    """A finished request as a server recorded it (`disaggsdk.serve.metrics.ServedRequest`, a
    frozen record: read-only here)."""

    @property
    def instance(self) -> str: ...
    @property
    def timeline(self) -> RequestTimeline: ...
    @property
    def ended_s(self) -> float: ...


@dataclass(frozen=True)
class InstanceRow:
    """One line of the live table. Latency columns are None where the instance served nothing."""

    name: str
    role: str
    healthy: bool
    num_requests: int  # finished within the window
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tokens_per_s_per_request: float | None
    running: int
    waiting: int
    kv_usage: float  # used / total pages, 0..1
    transfer_gb_per_s: float | None  # KV bytes moved / time spent moving them
    # speculative decoding: draft tokens accepted / proposed since start (None: it drafts nothing)
    spec_acceptance: float | None = None
    # prefix caching: prompt tokens found cached / looked up since start (None: nothing looked up)
    prefix_cache_hit_rate: float | None = None


def instance_rows(served: Sequence[Served], stats: Sequence[InstanceStats], now_s: float,
                  window_s: float = DEFAULT_WINDOW_S) -> list[InstanceRow]:
    """One row per instance, latencies from requests that ended in ``(now_s - window_s, now_s]``.

    Args:
        served: recent finished requests, each tagged with the instance that produced its tokens.
        stats: the backend's instance snapshots.
        now_s: the current time on the clock of ``ended_s``.
        window_s: how far back to look.
    """
    recent: dict[str, list[RequestTimeline]] = {}
    for s in served:
        if now_s - s.ended_s <= window_s and s.timeline.token_times_s:
            recent.setdefault(s.instance, []).append(s.timeline)
    rows = []
    for st in stats:
        timelines = recent.get(st.name, [])
        ttfts = [t.ttft_ms for t in timelines]
        tpots = [t.tpot_ms for t in timelines if t.tpot_ms is not None]
        c = st.counters
        rows.append(InstanceRow(
            name=st.name, role=st.role, healthy=st.healthy, num_requests=len(timelines),
            ttft_p50_ms=percentile(ttfts, 50) if ttfts else None,
            ttft_p99_ms=percentile(ttfts, 99) if ttfts else None,
            tokens_per_s_per_request=tokens_per_s_per_request(tpots) if tpots else None,
            running=st.running, waiting=st.waiting,
            kv_usage=st.kv_cache_usage,
            transfer_gb_per_s=c.transfer_bytes / c.transfer_s / 1e9 if c.transfer_s > 0 else None,
            spec_acceptance=c.spec_num_accepted_tokens / c.spec_num_draft_tokens if c.spec_num_draft_tokens else None,
            prefix_cache_hit_rate=c.prefix_cache_hit_rate,
        ))
    return rows


@dataclass(frozen=True)
class LatencySeries:
    """Points for the over-time plot: (seconds since ``origin_s``, milliseconds)."""

    ttft: list[tuple[float, float]]
    itl: list[tuple[float, float]]


def latency_series(served: Sequence[Served], origin_s: float) -> LatencySeries:
    """TTFT at each request's first token and every inter-token gap at its later token."""
    ttft: list[tuple[float, float]] = []
    itl: list[tuple[float, float]] = []
    for s in served:
        t = s.timeline
        if not t.token_times_s:
            continue
        ttft.append((t.token_times_s[0] - origin_s, t.ttft_ms))
        itl.extend((at - origin_s, gap) for at, gap in zip(t.token_times_s[1:], t.itls_ms))
    return LatencySeries(sorted(ttft), sorted(itl))
