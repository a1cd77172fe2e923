"""The host tier: page entries in this process's memory, a byte budget, evicted least recently used."""

from __future__ import annotations

import threading
from collections import OrderedDict

from disaggsdk.kv.tiers.base import TierConfigError, TierCounters


class HostTier:
    """An in-memory LRU of raw entries with a byte budget (a `base.KVTier`).

    Args:
        capacity_bytes: the most bytes of entries it holds.
    Raises:
        TierConfigError: ``capacity_bytes`` below 0.
    """

    name = "host"

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise TierConfigError(f"the host tier's capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.counters = TierCounters()
        self._entries: OrderedDict[str, bytes] = OrderedDict()  # least recently used first
        self._used_bytes = 0
        self._lock = threading.Lock()  # a metrics reader may look while the engine thread puts

    @property
    def used_bytes(self) -> int:
        """Bytes of the entries held now."""
        return self._used_bytes

    def contains(self, key: str) -> bool:
        """Whether ``key`` is held (counts nothing, leaves the LRU order)."""
        return key in self._entries

    def get(self, key: str) -> bytes | None:
        """The entry under ``key`` (now the most recently used), or None."""
        with self._lock:
            raw = self._entries.get(key)
            if raw is not None:
                self._entries.move_to_end(key)
            return self.counters.count_get(raw)

    def put(self, key: str, raw: bytes) -> list[tuple[str, bytes]]:
        """Hold ``raw`` under ``key`` as the most recently used entry.

        Returns:
            the entries evicted to make room, least recently used first; ``[(key, raw)]`` when
            ``raw`` alone is bigger than the capacity (then not held, and no older copy either).
        """
        with self._lock:
            self._remove(key)
            if len(raw) > self.capacity_bytes:
                return [(key, raw)]
            evicted = []
            while self._used_bytes + len(raw) > self.capacity_bytes:
                old_key, old_raw = self._entries.popitem(last=False)
                self._used_bytes -= len(old_raw)
                evicted.append((old_key, old_raw))
            self._entries[key] = raw
            self._used_bytes += len(raw)
            self.counters.evictions += len(evicted)
            self.counters.bytes_written += len(raw)
            return evicted

    def discard(self, key: str) -> None:
        """Drop ``key`` if held."""
        with self._lock:
            self._remove(key)

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._entries.clear()
            self._used_bytes = 0

    def close(self) -> None:
        """Drop every entry."""
        self.clear()

    def _remove(self, key: str) -> None:
        raw = self._entries.pop(key, None)
        if raw is not None:
            self._used_bytes -= len(raw)
