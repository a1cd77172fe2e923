"""What one instance reports about itself: the measured record /metrics and the live views read.

A plain record, filled by whoever runs the instance (the in-process backend, the router over a
`Runtime`); report only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from disaggsdk.records.unit_counters import UnitCounters


@dataclass
class InstanceStats:
    """A snapshot of one instance, for /metrics and the live views: gauges, and its counters
    (cumulative) as the instance sent them."""

    name: str
    role: str  # "prefill" | "decode" | "mixed"
    healthy: bool = True
    running: int = 0
    waiting: int = 0
    kv_pages_used: int = 0
    kv_pages_total: int = 0
    kv_grant_keys_open: int = 0  # registrations open to remote KV writes, one attempt each (decode units)
    counters: UnitCounters = field(default_factory=UnitCounters)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV pages in use, 0..1 (vLLM's ``kv_cache_usage_perc``); 0 without a pool."""
        return self.kv_pages_used / self.kv_pages_total if self.kv_pages_total else 0.0
