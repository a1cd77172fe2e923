"""The contract of one KV tier (host memory, local disk, a shared store) and its counters.

A tier holds raw page entries (`page_entry.encode_entry`) under string keys, evicts the least
recently used ones when its byte budget is full, and never raises on a failed read or write of its
medium: it counts the failure and answers as a miss or a dropped write. `tier_stack.TierStack`
stacks tiers fastest first and spills what one evicts into the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from disaggsdk.errors import DisaggError


class TierConfigError(DisaggError):
    """A tier, a page identity or a tier stack is configured wrongly (the message says what to fix)."""


@dataclass
class TierCounters:
    """Cumulative counts of one tier, for /metrics. Each is only ever increased."""

    hits: int = 0  # `get` calls that returned an entry
    misses: int = 0  # `get` calls that found none (or could not reach the medium)
    bytes_read: int = 0  # bytes of the entries `get` returned
    bytes_written: int = 0  # bytes of the entries `put` stored
    evictions: int = 0  # entries removed to make room (LRU)
    corrupt: int = 0  # entries that failed verification when loaded, and were discarded
    errors: int = 0  # failed reads or writes of the medium (I/O errors, an unreachable store)
    dropped_writes: int = 0  # writes never made: the writer's queue was full, or the medium was down

    def count_get(self, raw: bytes | None) -> bytes | None:
        """Count one `get` that found ``raw`` (None: a miss); returns it."""
        if raw is None:
            self.misses += 1
        else:
            self.hits += 1
            self.bytes_read += len(raw)
        return raw


class KVTier(Protocol):
    """One tier of KV page entries: a byte budget of raw entries by key, evicted LRU."""

    name: str  # "host" | "disk" | "store"
    counters: TierCounters
    capacity_bytes: int

    @property
    def used_bytes(self) -> int:
        """Bytes the tier's entries take now (on disk: whole 4096-byte blocks)."""

    def contains(self, key: str) -> bool:
        """Whether the tier holds ``key`` now; cheap, counts nothing (a store: one EXISTS, False when unreachable)."""

    def get(self, key: str) -> bytes | None:
        """The raw entry under ``key``, or None when absent or unreachable; makes it the most recently used."""

    def put(self, key: str, raw: bytes) -> list[tuple[str, bytes]]:
        """Store ``raw`` under ``key`` (replacing what was there).

        Returns:
            the ``(key, raw)`` entries evicted to make room, least recently used first, so that a
            stack can spill them to the next tier; ``raw`` itself when it is bigger than the whole
            capacity (it is not stored).
        """

    def discard(self, key: str) -> None:
        """Remove ``key`` if present (a corrupt entry); not an eviction."""

    def close(self) -> None:
        """Release the tier's resources; its entries on disk or in a store stay."""
