"""What the server measured, as Prometheus metrics and as recent timelines for the live views.

One `ServerMetrics` per server, with its own prometheus_client registry (never the global one:
two servers in one process, as in tests and notebooks, must not share counters). Request-level
figures are recorded when a request ends, under vLLM's names and meanings (labels ``model_name``
and ``engine``, the engine that produced the tokens); engine gauges and counters are read from the
backend's ``stats()`` at scrape time (`serve.engine_metrics`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.report.latency import RequestTimeline
from disaggsdk.serve.engine_metrics import PREFIX, EngineCollector

# finer than vLLM's at the low end (its inter-token buckets start at 10 ms; a small model decodes faster)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS_S = (*LATENCY_BUCKETS_S, 160.0, 320.0, 640.0, 1280.0, 2560.0)  # whole requests run longer
DEFAULT_MAX_TOKENS = 131072  # the token histograms' top bucket when the context length is not known
MAX_RECENT_REQUESTS = 4096  # the live views look at the latest requests only


class StatsSource(Protocol):
    """A backend's ``stats``: one snapshot per instance; ``wait_s`` > 0 waits that long for fresh ones."""

    def __call__(self, wait_s: float = 0.0) -> Sequence[InstanceStats]:
        """The snapshots."""


def one_two_five_buckets(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(float(b) for b in buckets)
            buckets.append(mantissa * scale)
        scale *= 10


def chunk_gaps_s(token_times_s: Sequence[float]) -> list[float]:
    """Gaps between the arrivals of successive outputs, one per output (as vLLM's inter-token
    latency): the tokens of one output (speculative decoding's accepted drafts) share an arrival
    time, and the zero gaps between them are not latencies anyone waited."""
    arrivals = [t for i, t in enumerate(token_times_s) if i == 0 or t != token_times_s[i - 1]]
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


@dataclass(frozen=True)
class ServedRequest:
    """One finished request as the server saw it (times on ``time.monotonic``)."""

    instance: str  # the engine that produced its tokens
    timeline: RequestTimeline
    finish_reason: str | None
    ended_s: float


class ServerMetrics:
    """Per-server metrics registry and the recent requests the live views summarise.

    Args:
        stats: the backend's ``stats`` callable (given ``wait_s``).
        model_name: the ``model_name`` label.
        max_model_len: the top of the prompt / generation token buckets (default: 131072).
    """

    def __init__(self, stats: StatsSource, model_name: str,
                 max_model_len: int | None = None):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self._stats = stats
        labels = ["model_name", "engine"]

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(f"{PREFIX}_{name}", doc, labels, registry=self.registry, buckets=buckets)

        self.ttft = hist("time_to_first_token_seconds", "Time from request arrival to its first token.",
                         LATENCY_BUCKETS_S)
        self.itl = hist("inter_token_latency_seconds", "Time between two successive outputs of a request.",
                        LATENCY_BUCKETS_S)
        self.tpot = hist("request_time_per_output_token_seconds",
                         "Per request: (e2e latency - TTFT) / (output tokens - 1).", LATENCY_BUCKETS_S)
        self.e2el = hist("e2e_request_latency_seconds", "Time from request arrival to its last token.",
                         REQUEST_BUCKETS_S)
        self.decode_time = hist("request_decode_time_seconds", "Time from a request's first token to its last.",
                                REQUEST_BUCKETS_S)
        token_buckets = one_two_five_buckets(max_model_len or DEFAULT_MAX_TOKENS)
        self.request_prompt_tokens = hist("request_prompt_tokens", "Prompt tokens of a request.", token_buckets)
        self.request_generation_tokens = hist("request_generation_tokens", "Tokens generated for a request.",
                                              token_buckets)
        self.finished = Counter(f"{PREFIX}_request_success", "Requests finished, by finish reason.",
                                [*labels, "finished_reason"], registry=self.registry)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of served requests.",
                                     labels, registry=self.registry)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated.",
                                         labels, registry=self.registry)
        # the front end's own bound (serve.max_queued_requests): what waits, and what it turned away
        self.refused = Counter(f"{PREFIX}_requests_refused",
                               "Requests the front end answered 503 before any engine saw them, by reason "
                               "(queue_full: serve.max_queued_requests).", ["model_name", "reason"],
                               registry=self.registry)
        self.queued = Gauge(f"{PREFIX}_front_end_requests_queued",
                            "Requests the front end handed to the engines that have no first token yet.",
                            ["model_name"], registry=self.registry)
        self.registry.register(EngineCollector(stats, model_name))
        self._lock = threading.Lock()  # record() runs on the server loop, recent() on viewers' threads
        self._recent: deque[ServedRequest] = deque(maxlen=MAX_RECENT_REQUESTS)
        self.num_served = 0

    def record(self, timeline: RequestTimeline, instance: str, finish_reason: str | None) -> None:
        """Account one finished request. Requests that produced no token count only by reason.

        Args:
            timeline: when it arrived and when each output token came.
            instance: the engine that produced its tokens ("" when none did).
            finish_reason: why it ended (None: unknown).
        """
        self.finished.labels(self.model_name, instance, finish_reason or "unknown").inc()
        if not timeline.token_times_s:
            return
        labels = (self.model_name, instance)
        self.ttft.labels(*labels).observe(timeline.ttft_ms / 1e3)
        self.e2el.labels(*labels).observe(timeline.e2el_ms / 1e3)
        self.decode_time.labels(*labels).observe(timeline.token_times_s[-1] - timeline.token_times_s[0])
        for gap_s in chunk_gaps_s(timeline.token_times_s):
            self.itl.labels(*labels).observe(gap_s)
        if timeline.tpot_ms is not None:
            self.tpot.labels(*labels).observe(timeline.tpot_ms / 1e3)
        self.request_prompt_tokens.labels(*labels).observe(timeline.prompt_tokens)
        self.request_generation_tokens.labels(*labels).observe(timeline.output_tokens)
        self.prompt_tokens.labels(*labels).inc(timeline.prompt_tokens)
        self.generation_tokens.labels(*labels).inc(timeline.output_tokens)
        with self._lock:
            self._recent.append(ServedRequest(instance, timeline, finish_reason, time.monotonic()))
            self.num_served += 1

    def count_queued_with(self, num_queued: Callable[[], int]) -> None:
        """Read the front end's queue depth from ``num_queued`` at each scrape."""
        self.queued.labels(self.model_name).set_function(num_queued)

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
