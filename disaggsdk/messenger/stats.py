"""A messenger's measurements: its counters (the unit's `UnitCounters`, which the messenger fills)
and the per-request handoff records the benchmark reads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from disaggsdk.records.request_transfer import RequestTransfer
from disaggsdk.records.unit_counters import UnitCounters

MAX_RECENT = 2048  # per-request records kept for the benchmark


@dataclass
class TransferTotals:
    """What one unit's messenger measured since start: cumulative counters, recent records."""

    counters: UnitCounters = field(default_factory=UnitCounters)
    recent: deque[RequestTransfer] = field(default_factory=lambda: deque(maxlen=MAX_RECENT))

    def add(self, record: RequestTransfer) -> None:
        """Count one finished request and keep its record."""
        self.counters.count_transfer(record)
        self.recent.append(record)
