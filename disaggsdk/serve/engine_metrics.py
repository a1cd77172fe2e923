"""The per-engine gauges and counters of /metrics, read from the backend's `InstanceStats` at each scrape.

Names and meanings follow vLLM's (``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``,
``vllm:num_preemptions``, ``vllm:spec_decode_*``, ``vllm:prefix_cache_queries`` / ``_hits``) under
our ``disaggsdk_`` prefix, with vLLM's ``engine`` label: a label named ``instance`` would collide
with the target label Prometheus adds itself (the scrape renames ours ``exported_instance``). What
vLLM has no name for is ours: the KV handoff between prefill and decode engines (``kv_transfer_*``,
``kv_exposed_transfer_seconds``, and what a decode engine's prefix cache spared it:
``kv_not_sent_*``, ``requests_fully_cached``), retries and refused control frames. Each series also
carries the engine's ``role`` (prefill, decode or mixed) so a dashboard can split a disaggregated
deployment.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from disaggsdk.report.instance_stats import InstanceStats

PREFIX = "disaggsdk"
ENGINE_LABELS = ("model_name", "engine", "role")
SCRAPE_FRESH_WAIT_S = 1.0  # a scrape waits this long at most for every engine's fresh answer

# (attribute of InstanceStats, metric name, help); counters get ``_total`` from prometheus_client
GAUGES = (
    ("running", "num_requests_running", "Requests in the engine's running batch."),
    ("waiting", "num_requests_waiting", "Requests waiting to be scheduled by the engine."),
    ("kv_pages_used", "kv_pages_used", "KV cache pages in use."),
    ("kv_pages_total", "kv_pages_capacity", "KV cache pages in the engine's pool (used or free)."),
    ("healthy", "engine_healthy", "1 while the engine is serving, 0 when it is down."),
)
COUNTERS = (
    ("transfer_bytes", "kv_transfer_bytes", "KV bytes written from this prefill engine to decode engines."),
    ("transfer_writes", "kv_transfer_writes", "KV page writes issued by this prefill engine."),
    ("transfer_s", "kv_transfer_seconds", "Time spent writing KV, first write submitted to last completed."),
    ("exposed_transfer_s", "kv_exposed_transfer_seconds",
     "KV transfer time not hidden behind the prefill forward pass (measured on decode engines)."),
    ("transfer_failures", "kv_transfer_failures", "KV handoff attempts that failed."),
    ("requests_retried", "requests_retried", "Requests re-sent to another prefill engine."),
    ("spec_num_drafts", "spec_decode_num_drafts", "Verify steps that carried draft tokens."),
    ("spec_num_draft_tokens", "spec_decode_num_draft_tokens", "Draft tokens proposed."),
    ("spec_num_accepted_tokens", "spec_decode_num_accepted_tokens", "Draft tokens accepted."),
    ("prefix_cache_queries", "prefix_cache_queries", "Prefix cache queries, in prompt tokens looked up."),
    ("prefix_cache_hits", "prefix_cache_hits", "Prefix cache hits, in prompt tokens found cached."),
    ("pages_not_sent", "kv_not_sent_pages",
     "KV pages (of every layer and rank) a decode engine's prefix cache held, so no prefill engine sent them."),
    ("bytes_not_sent", "kv_not_sent_bytes", "KV bytes a decode engine's prefix cache spared the transfer."),
    ("requests_fully_cached", "requests_fully_cached",
     "Requests whose whole prompt a decode engine had cached: no prefill at all."),
    ("requests_prefilled_short", "requests_prefilled_short",
     "Requests a decode engine prefilled itself because few of their prompt tokens were missing from its "
     "cache (transfer.max_local_prefill_tokens)."),
    ("kv_pages_failed_verification", "kv_pages_failed_verification",
     "KV handoff attempts whose pages did not match the prefill engine's digest (transport.verify_pages): "
     "forged or corrupted writes, retried and never used."),
)
BY_REASON = (
    ("rejected_frames", "control_frames_rejected", "Control frames dropped, by reason (bad MAC, replayed, ...)."),
    ("rejected_requests", "prefill_requests_rejected", "Prefill requests refused by a prefill engine, by reason."),
)
PREEMPTIONS_KEY = "num_preemptions"  # in `InstanceStats.extra` where the engine reports it


class EngineCollector:
    """A prometheus_client collector of every engine's snapshot, fresh at each scrape (an engine
    answers between two steps, in milliseconds), never the snapshot of the scrape before.

    Args:
        stats: the backend's ``stats`` callable (given ``wait_s``).
        model_name: the ``model_name`` label.
    """

    def __init__(self, stats: Callable[[float], Sequence[InstanceStats]], model_name: str):
        self._stats = stats
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
        """One family per metric, one sample per engine (and reason, or draft position)."""
        labels = list(ENGINE_LABELS)
        gauges = {attr: GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels) for attr, name, doc in GAUGES}
        usage = GaugeMetricFamily(f"{PREFIX}_kv_cache_usage_perc", "KV cache usage, used / all pages; 1 means full.",
                                  labels=labels)
        counters = {attr: CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=labels) for attr, name, doc in COUNTERS}
        preemptions = CounterMetricFamily(f"{PREFIX}_num_preemptions", "Requests preempted by the engine "
                                          "(pages taken back, recomputed later).", labels=labels)
        per_position = CounterMetricFamily(f"{PREFIX}_spec_decode_num_accepted_tokens_per_pos",
                                           "Draft tokens accepted, by position in the draft.",
                                           labels=[*labels, "position"])
        by_reason = {attr: CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=[*labels, "reason"])
                     for attr, name, doc in BY_REASON}
        for s in self._stats(SCRAPE_FRESH_WAIT_S):
            values = [self._model, s.name, s.role]
            for attr, family in (gauges | counters).items():
                family.add_metric(values, float(getattr(s, attr)))
            usage.add_metric(values, s.kv_cache_usage)
            # only engines that count preemptions report them: no sample rather than a false 0
            if PREEMPTIONS_KEY in s.extra:
                preemptions.add_metric(values, float(s.extra[PREEMPTIONS_KEY]))
            for attr, family in by_reason.items():
                for reason, count in sorted(getattr(s, attr).items()):
                    family.add_metric([*values, reason], float(count))
            for position, count in enumerate(s.spec_accepted_per_position):
                per_position.add_metric([*values, str(position)], float(count))
        yield from gauges.values()
        yield usage
        yield from counters.values()
        yield preemptions
        yield per_position
        yield from by_reason.values()
