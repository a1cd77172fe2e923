"""`UnitCounters` is the one declaration of an engine's counters: a field added there travels in a
unit's stats frame and is exported by /metrics with no other change (issue 34)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from disaggsdk.launch import messages as ch
from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.records.request_transfer import RequestTransfer
from disaggsdk.records.unit_counters import SeriesKind, UnitCounters, counter, exported_series
from disaggsdk.serve.metrics import ServerMetrics
from disaggsdk.serve.routing.unit_gauges import instance_stats
from tests.serve.promlint import lint

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


class WithOneMore(UnitCounters, kw_only=True):
    """The record as it reads once someone declares one more counter: nothing else changes."""

    widgets_made: Annotated[int, counter("widgets_made", "Widgets this engine made.")] = 0


def stats_frame(counters: UnitCounters) -> ch.UnitStats:
    return ch.UnitStats(seq=1, name="decode-0", role="decode", running=0, waiting=0, num_free_pages=4, num_pages=8,
                        counters=counters, recent=[])


def scrape(stats: list[InstanceStats]) -> str:
    return ServerMetrics(lambda wait_s=0.0: stats, "m").exposition().decode()


def test_a_counter_declared_in_the_record_alone_is_in_metrics():
    counters = WithOneMore(widgets_made=3, transfer_bytes=10)
    counters.widgets_made += 1  # its producer counts it
    text = scrape([instance_stats("decode-0", "decode", True, stats_frame(counters))])
    assert lint(text) == []
    assert 'disaggsdk_widgets_made_total{engine="decode-0",model_name="m",role="decode"} 4.0' in text
    assert "# HELP disaggsdk_widgets_made_total Widgets this engine made." in text
    assert 'disaggsdk_kv_transfer_bytes_total{engine="decode-0",model_name="m",role="decode"} 10.0' in text


def test_every_declared_field_travels_in_a_units_stats_frame():
    values: dict[str, object] = {}
    for i, f in enumerate(msgspec.structs.fields(UnitCounters), start=1):  # a distinct value in every field
        default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
        values[f.name] = {dict: {"reason": i}, list: [i, i + 1], float: i + 0.5, int: i}[type(default)]
    sent = UnitCounters(**values)  # type: ignore[arg-type]  # every field, by name
    frame = ch.FROM_UNIT.decode(msgspec.msgpack.encode(stats_frame(sent)))
    assert isinstance(frame, ch.UnitStats) and frame.counters == sent


def test_a_peer_reads_a_frame_with_a_counter_it_does_not_know():
    # no protocol bump for a new counter: an older router skips it, a newer one reads 0 from an older unit
    frame = ch.FROM_UNIT.decode(msgspec.msgpack.encode(stats_frame(WithOneMore(widgets_made=2, transfer_writes=5))))
    assert isinstance(frame, ch.UnitStats) and frame.counters == UnitCounters(transfer_writes=5)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(UnitCounters(transfer_writes=5)), type=WithOneMore).widgets_made == 0


def test_every_declared_series_is_exported_and_documented():
    series = list(exported_series())
    text = scrape([InstanceStats("prefill-0", "prefill", counters=UnitCounters(
        rejected_frames={"BadMac": 1}, rejected_requests={"overloaded": 1}, spec_accepted_per_position=[1]))])
    exported = {f.name for f in text_string_to_metric_families(text)}
    documented = DOCS.read_text()
    for one in series:
        assert f"disaggsdk_{one.metric}" in exported, one
        assert f"disaggsdk_{one.metric}_total" in documented or f"..._{one.metric.split('_', 2)[-1]}_total" in documented, \
            f"docs/metrics.md does not list disaggsdk_{one.metric}_total"
    assert {one.kind for one in series} == set(SeriesKind)


def test_the_record_counts_a_finished_handoff():
    counters = UnitCounters()
    counters.count_transfer(RequestTransfer("r", "prefill", 9, bytes=4096, writes=3, transfer_s=0.25))
    counters.count_not_sent(2, 8192)
    assert (counters.requests_transferred, counters.transfer_bytes, counters.transfer_writes) == (1, 4096, 3)
    assert (counters.transfer_s, counters.pages_not_sent, counters.bytes_not_sent) == (0.25, 2, 8192)
    assert counters.prefix_cache_hit_rate is None


@pytest.mark.parametrize("hits, queries, rate", [(0, 0, None), (50, 200, 0.25)])
def test_hit_rate(hits, queries, rate):
    assert UnitCounters(prefix_cache_hits=hits, prefix_cache_queries=queries).prefix_cache_hit_rate == rate
