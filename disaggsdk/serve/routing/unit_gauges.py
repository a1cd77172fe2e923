"""A unit's `UnitStats` message as the `InstanceStats` snapshot /metrics and the live views read."""

from __future__ import annotations

from disaggsdk.launch import messages as ch
from disaggsdk.records.instance_stats import InstanceStats


def instance_stats(name: str, role: str, healthy: bool, s: ch.UnitStats | None) -> InstanceStats:
    """One unit's gauges and counters as it sent them; zeros for a unit without a snapshot (not
    answered yet, or dead)."""
    if s is None:
        return InstanceStats(name=name, role=role, healthy=healthy)
    return InstanceStats(name=name, role=role, healthy=healthy, running=s.running, waiting=s.waiting,
                         kv_pages_used=s.num_pages - s.num_free_pages, kv_pages_total=s.num_pages,
                         kv_grant_keys_open=s.open_grant_keys, counters=s.counters)
