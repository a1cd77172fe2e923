"""The per-engine gauges and counters of /metrics, read from the backend's `InstanceStats` at each scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.records.unit_counters import Series, SeriesKind, UnitCounters, exported_series

PREFIX = "disaggsdk"
ENGINE_LABELS = ("model_name", "engine", "role")
SCRAPE_FRESH_WAIT_S = 1.0  # a scrape waits this long at most for every engine's fresh answer

# (attribute of InstanceStats, metric name, help); counters get ``_total`` from prometheus_client
GAUGES = (
    ("running", "num_requests_running", "Requests in the engine's running batch."),
    ("waiting", "num_requests_waiting", "Requests waiting to be scheduled by the engine."),
    ("kv_pages_used", "kv_pages_used", "KV cache pages in use."),
    ("kv_pages_total", "kv_pages_capacity", "KV cache pages in the engine's pool (used or free)."),
    ("kv_grant_keys_open", "kv_grant_keys_open", "Registrations open to remote KV writes, each for one transfer "
     "attempt's pages (transport.grant_keys); 0 once every transfer has ended."),
    ("healthy", "engine_healthy", "1 while the engine is serving, 0 when it is down."),
)


class EngineCollector:
    """A prometheus_client collector of every engine's snapshot, fresh at each scrape (an engine
    answers between two steps, in milliseconds), never the snapshot of the scrape before.

    The counters are those `UnitCounters` declares (`records.unit_counters`): each field that names
    a series is exported, so a counter added there appears here with no change.

    Args:
        stats: the backend's ``stats`` callable (given ``wait_s``).
        model_name: the ``model_name`` label.
    """

    def __init__(self, stats: Callable[[float], Sequence[InstanceStats]], model_name: str):
        self._stats = stats
        self._model = model_name

    def collect(self) -> Iterator[Metric]:
        """One family per metric, one sample per engine (and reason, tier or draft position)."""
        snapshots = list(self._stats(SCRAPE_FRESH_WAIT_S))
        labels = list(ENGINE_LABELS)
        gauges = {attr: GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=labels) for attr, name, doc in GAUGES}
        usage = GaugeMetricFamily(f"{PREFIX}_kv_cache_usage_perc", "KV cache usage, used / all pages; 1 means full.",
                                  labels=labels)
        series = _series_of(snapshots)
        extra_label = {SeriesKind.COUNTER: [], SeriesKind.BY_REASON: ["reason"], SeriesKind.BY_TIER: ["tier"],
                       SeriesKind.PER_POSITION: ["position"]}
        counters = {one.attribute: CounterMetricFamily(f"{PREFIX}_{one.metric}", one.help,
                                                       labels=[*labels, *extra_label[one.kind]])
                    for one in series}
        for s in snapshots:
            values = [self._model, s.name, s.role]
            gauges["running"].add_metric(values, float(s.running))
            gauges["waiting"].add_metric(values, float(s.waiting))
            gauges["kv_pages_used"].add_metric(values, float(s.kv_pages_used))
            gauges["kv_pages_total"].add_metric(values, float(s.kv_pages_total))
            gauges["kv_grant_keys_open"].add_metric(values, float(s.kv_grant_keys_open))
            gauges["healthy"].add_metric(values, float(s.healthy))
            usage.add_metric(values, s.kv_cache_usage)
            for one in series:
                _add_samples(counters[one.attribute], values, one, s.counters)
        yield from gauges.values()
        yield usage
        yield from counters.values()


def _series_of(snapshots: Sequence[InstanceStats]) -> list[Series]:
    """The series every snapshot's record declares (one type in a deployment; a test may add a field)."""
    by_attribute: dict[str, Series] = {}
    record_types: list[type[UnitCounters]] = [UnitCounters, *(type(s.counters) for s in snapshots)]
    for record_type in record_types:
        for one in exported_series(record_type):
            by_attribute.setdefault(one.attribute, one)
    return list(by_attribute.values())


def _add_samples(family: CounterMetricFamily, values: list[str], one: Series, counters: UnitCounters) -> None:
    value: object = getattr(counters, one.attribute, None)  # a field of the record's declaration (or a subclass's)
    if one.kind is SeriesKind.COUNTER and isinstance(value, int | float):
        family.add_metric(values, float(value))
    elif one.kind in (SeriesKind.BY_REASON, SeriesKind.BY_TIER) and isinstance(value, dict):
        for label, count in sorted(value.items()):
            family.add_metric([*values, label], float(count))
    elif one.kind is SeriesKind.PER_POSITION and isinstance(value, list):
        for position, count in enumerate(value):
            family.add_metric([*values, str(position)], float(count))
