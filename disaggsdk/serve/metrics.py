"""What the server measured, as Prometheus metrics and as recent timelines for the live views.

One `ServerMetrics` per server, with its own prometheus_client registry (never the global one:
two servers in one process, as in tests and notebooks, must not share counters). Latencies are
recorded per request when it ends; queue depths, KV usage and transfer counters are read from
the backend's `stats()` at scrape time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from disaggsdk.report.latency import RequestTimeline
from disaggsdk.report.instance_stats import InstanceStats

PREFIX = "disaggsdk"
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
SCRAPE_FRESH_WAIT_S = 1.0  # a scrape waits this long at most for every unit's fresh answer
MAX_RECENT_REQUESTS = 4096  # the live views look at the latest requests only


@dataclass(frozen=True)
class ServedRequest:
    """One finished request as the server saw it (times on ``time.monotonic``)."""

    instance: str
    timeline: RequestTimeline
    finish_reason: str | None
    ended_s: float


class _BackendCollector:
    """Gauges and counters read from ``backend.stats(wait_s)`` at each scrape: fresh, not the
    snapshot of the scrape before (a unit answers between two steps, in milliseconds)."""

    def __init__(self, stats: Callable[[float], Sequence[InstanceStats]], model_name: str):
        self._stats = stats
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "instance", "role"]

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels)

        families = {
            "running": gauge("num_requests_running", "Requests in the instance's running batch."),
            "waiting": gauge("num_requests_waiting", "Requests queued at the instance."),
            "kv_pages_used": gauge("kv_pages_used", "KV cache pages in use."),
            "kv_pages_total": gauge("kv_pages_total", "KV cache pages in the pool."),
            "healthy": gauge("instance_healthy", "1 when the instance is serving."),
            "transfer_bytes": counter("kv_transfer_bytes", "KV bytes written to decode instances."),
            "transfer_writes": counter("kv_transfer_writes", "KV page writes issued."),
            "transfer_s": counter("kv_transfer_seconds", "Time spent transferring KV."),
            "exposed_transfer_s": counter("kv_exposed_transfer_seconds",
                                          "Transfer time not hidden behind the prefill forward pass."),
            "transfer_failures": counter("kv_transfer_failures", "KV transfers that failed."),
            "requests_retried": counter("requests_retried", "Requests re-sent to another prefill instance."),
            # vLLM's spec_decode counters, under our prefix
            "spec_num_drafts": counter("spec_decode_num_drafts", "Verify steps that carried drafts."),
            "spec_num_draft_tokens": counter("spec_decode_num_draft_tokens", "Draft tokens proposed."),
            "spec_num_accepted_tokens": counter("spec_decode_num_accepted_tokens", "Draft tokens accepted."),
        }
        per_position = CounterMetricFamily(
            f"{PREFIX}_spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by position in the draft.",
            labels=[*labels, "position"])
        by_reason = {
            "rejected_frames": CounterMetricFamily(
                f"{PREFIX}_control_frames_rejected", "Control frames dropped (bad MAC, replayed, stale, ...).",
                labels=[*labels, "reason"]),
            "rejected_requests": CounterMetricFamily(
                f"{PREFIX}_prefill_requests_rejected", "Prefill requests refused by a prefill instance.",
                labels=[*labels, "reason"]),
        }
        for s in self._stats(SCRAPE_FRESH_WAIT_S):
            values = [self._model, s.name, s.role]
            for attr, family in families.items():
                family.add_metric(values, float(getattr(s, attr)))
            for attr, family in by_reason.items():
                for reason, count in sorted(getattr(s, attr).items()):
                    family.add_metric([*values, reason], float(count))
            for position, count in enumerate(s.spec_accepted_per_position):
                per_position.add_metric([*values, str(position)], float(count))
        yield from families.values()
        yield from by_reason.values()
        yield per_position


class ServerMetrics:
    """Per-server metrics registry and the recent requests the live views summarise.

    Args:
        stats: the backend's ``stats`` callable (given ``wait_s``).
        model_name: the ``model_name`` label.
    """

    def __init__(self, stats: Callable[[float], Sequence[InstanceStats]], model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self._stats = stats
        labels = ["model_name", "instance"]
        hist = lambda name, doc: Histogram(  # noqa: E731 - four histograms differ only in name and doc
            f"{PREFIX}_{name}", doc, labels, registry=self.registry, buckets=LATENCY_BUCKETS_S)
        self.ttft = hist("time_to_first_token_seconds", "Time from request arrival to its first token.")
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive output tokens.")
        self.tpot = hist("time_per_output_token_seconds", "Mean time per output token after the first, per request.")
        self.e2el = hist("e2e_request_latency_seconds", "Time from request arrival to its last token.")
        self.finished = Counter(f"{PREFIX}_request_success", "Requests finished, by finish reason.",
                                ["model_name", "finish_reason"], registry=self.registry)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of served requests.",
                                     ["model_name"], registry=self.registry)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated.",
                                         ["model_name"], registry=self.registry)
        self.registry.register(_BackendCollector(stats, model_name))
        self._lock = threading.Lock()  # record() runs on the server loop, recent() on viewers' threads
        self._recent: deque[ServedRequest] = deque(maxlen=MAX_RECENT_REQUESTS)
        self.num_served = 0

    def record(self, timeline: RequestTimeline, instance: str, finish_reason: str | None) -> None:
        """Account one finished request. Requests that produced no token count only by reason."""
        self.finished.labels(self.model_name, finish_reason or "unknown").inc()
        if not timeline.token_times_s:
            return
        labels = (self.model_name, instance)
        self.ttft.labels(*labels).observe(timeline.ttft_ms / 1e3)
        self.e2el.labels(*labels).observe(timeline.e2el_ms / 1e3)
        for gap_ms in timeline.itls_ms:
            self.itl.labels(*labels).observe(gap_ms / 1e3)
        if timeline.tpot_ms is not None:
            self.tpot.labels(*labels).observe(timeline.tpot_ms / 1e3)
        self.prompt_tokens.labels(self.model_name).inc(timeline.prompt_tokens)
        self.generation_tokens.labels(self.model_name).inc(timeline.output_tokens)
        with self._lock:
            self._recent.append(ServedRequest(instance, timeline, finish_reason, time.monotonic()))
            self.num_served += 1

    def recent(self) -> list[ServedRequest]:
        """The latest served requests, oldest first."""
        with self._lock:
            return list(self._recent)

    def stats(self) -> list[InstanceStats]:
        """The backend's instance snapshots."""
        return list(self._stats())

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
