"""Transfer measurements: one record per request, cumulative counters per unit.

Pure bookkeeping (no clocks read here): the messengers fill it, the launcher ships it to
`InstanceStats`, the benchmark reads the per-request records.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import msgspec

MAX_RECENT = 2048  # per-request records kept for the benchmark


class RequestTransfer(msgspec.Struct, frozen=True):
    """One request's handoff as measured on one side."""

    request_id: str
    side: str  # "prefill" | "decode"
    num_tokens: int
    bytes: int = 0  # prefill: bytes sent (context included)
    writes: int = 0  # prefill: write entries sent
    transfer_s: float = 0.0  # prefill: first write submitted -> last write completed locally
    exposed_s: float = 0.0  # decode: prefill forward ended -> counter fired
    lead_s: float = 0.0  # prefill: first write submitted -> forward ended (> 0: streamed during it)
    attempts: int = 1  # decode: prefill attempts (1 = no retry)
    prefilled_locally: bool = False
    # Where the time to first token went: time.monotonic() of the unit, the one clock of a machine
    # (phases that cross units are only meaningful on one machine). 0.0: not measured.
    arrived_s: float = 0.0  # prefill: its request frame was handled
    forward_start_s: float = 0.0  # prefill: the step with its first chunk began
    forward_end_s: float = 0.0  # both: prefill's forward pass ended (decode: read from the context)
    submitted_s: float = 0.0  # decode: the request reached the decode unit
    sent_s: float = 0.0  # decode: its (last) prefill request was sent
    fired_s: float = 0.0  # decode: its counter fired (every write of it landed)
    admitted_s: float = 0.0  # decode: handed to the engine's scheduler


@dataclass
class TransferTotals:
    """Cumulative counters of one unit's messenger."""

    requests: int = 0
    bytes: int = 0
    writes: int = 0
    transfer_s: float = 0.0
    exposed_s: float = 0.0
    failures: int = 0  # attempts that failed (deadline, peer down, rejected, transfer error)
    retries: int = 0  # attempts re-sent to another prefill instance
    prefilled_locally: int = 0
    # decode: prompt pages (of every layer and rank) its prefix cache held, so nobody sent them,
    # and their bytes; requests whose whole prompt was cached here needed no prefill at all
    pages_not_sent: int = 0
    bytes_not_sent: int = 0
    fully_cached: int = 0
    # decode: requests prefilled here, without a prefill unit, because few enough of their prompt
    # tokens were missing from the cache (transfer.max_local_prefill_tokens); also in prefilled_locally
    prefilled_here_short: int = 0
    # decode, with transport.verify_pages: attempts whose pages did not match prefill's digest
    # (forged or corrupted writes); each was retried and its pages never used or cached
    pages_failed_verification: int = 0
    recent: deque[RequestTransfer] = field(default_factory=lambda: deque(maxlen=MAX_RECENT))

    def count_not_sent(self, num_pages: int, num_bytes: int) -> None:
        """Count prompt pages the decode side's prefix cache held (they did not move)."""
        self.pages_not_sent += num_pages
        self.bytes_not_sent += num_bytes

    def add(self, record: RequestTransfer) -> None:
        """Count one finished request."""
        self.requests += 1
        self.bytes += record.bytes
        self.writes += record.writes
        self.transfer_s += record.transfer_s
        self.exposed_s += record.exposed_s
        self.recent.append(record)
