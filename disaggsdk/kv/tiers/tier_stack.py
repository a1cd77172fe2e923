"""A unit's KV tiers stacked fastest first: which pages they hold, loading a page back, and writing
pages down (`TierStack`).

The engine thread calls the stack; the host tier is written on that thread, every slower tier by one
writer thread behind a queue bounded in bytes, so a slow disk or store never holds up a step (a full
queue drops the write and counts it). A page whose write is still queued is loaded from the queue.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Literal, get_args

from disaggsdk.kv.tiers.base import KVTier, TierConfigError, TierCounters
from disaggsdk.kv.tiers.disk_tier import DiskTier
from disaggsdk.kv.tiers.host_tier import HostTier
from disaggsdk.kv.tiers.page_entry import CorruptPageError, PageIdentity, decode_entry, encode_entry

WritePolicy = Literal["write_through", "on_eviction"]
DEFAULT_MAX_QUEUED_BYTES = 256 * 2**20
CLOSE_FLUSH_TIMEOUT_S = 10.0


@dataclasses.dataclass
class _Write:
    tier_index: int
    key: str
    raw: bytes


class TierStack:
    """Tiers of raw page entries under one page identity, fastest first.

    Args:
        identity: what this rank's pages are; entries under another identity are never loaded.
        tiers: fastest first (host, disk, store; any subset). A tier named "host" must come first:
            it is written synchronously, the others by the writer thread.
        write_policy: "write_through": every page the engine computes goes to every tier at once;
            "on_eviction": a page goes down only when it leaves the device pool, and what a tier
            evicts spills into the next one.
        max_queued_bytes: the most bytes of entries waiting for the writer thread; a write that
            would exceed it is dropped (counted in the target tier's ``dropped_writes``).
    Raises:
        TierConfigError: an unknown policy, two tiers of one name, the host tier not first.
    """

    def __init__(self, identity: PageIdentity, tiers: Sequence[KVTier], write_policy: WritePolicy,
                 max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES):
        if write_policy not in get_args(WritePolicy):
            raise TierConfigError(f"write_policy must be one of {', '.join(get_args(WritePolicy))}, got {write_policy!r}")
        names = [tier.name for tier in tiers]
        if len(set(names)) != len(names):
            raise TierConfigError(f"each tier may appear once, got {names}")
        if "host" in names[1:]:
            raise TierConfigError(f"the host tier must come first (tiers are fastest first), got {names}")
        if max_queued_bytes < 0:
            raise TierConfigError(f"max_queued_bytes must be >= 0, got {max_queued_bytes}")
        self.identity = identity
        self.tiers = tuple(tiers)
        self.write_policy = write_policy
        self.max_queued_bytes = max_queued_bytes
        self._host = self.tiers[0] if names[:1] == ["host"] else None
        self._first_background = 1 if self._host is not None else 0
        # counted by the stack rather than by a tier: corrupt entries, writes the queue dropped, the
        # writer's failures, loads served from the queue; `counters` adds them to the tier's own
        self._stack_counters = {name: TierCounters() for name in names}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a write queued, a write done, closing
        self._queue: deque[_Write] = deque()
        self._queued_bytes = 0
        self._num_unfinished = 0  # queued or being written
        self._pending: dict[str, bytes] = {}  # key -> raw, while a write of it is unfinished
        self._num_pending: Counter[tuple[str, int]] = Counter()  # (key, tier index) -> writes unfinished
        self._closing = False
        self._closed = False
        self._load_seconds = 0.0
        self._writer: threading.Thread | None = None
        if len(self.tiers) > self._first_background:
            self._writer = threading.Thread(target=self._write_loop, name="kv-tier-writer", daemon=True)
            self._writer.start()

    # what the tiers hold

    def num_cached_prefix(self, block_hashes: Sequence[bytes]) -> int:
        """The length of the longest prefix of ``block_hashes`` whose every page some tier holds (or
        the writer has queued); asks each tier's `contains`, fastest first."""
        num = 0
        for block_hash in block_hashes:
            key = self.identity.key(block_hash)
            with self._lock:
                queued = key in self._pending
            if not queued and not any(tier.contains(key) for tier in self.tiers):
                break
            num += 1
        return num

    def load(self, block_hash: bytes) -> bytes | None:
        """The verified data of the page ``block_hash``, from the first tier with a good copy.

        An entry that fails `page_entry.decode_entry` is discarded from its tier, counted in its
        ``corrupt``, and the search goes on down. A copy found below the host tier is put into the
        host tier too. Returns None when no tier has a good copy.
        """
        start = time.perf_counter()
        try:
            key = self.identity.key(block_hash)
            with self._lock:
                pending = self._pending.get(key)
                queued_for = min((i for i in range(len(self.tiers)) if self._num_pending[key, i]), default=0)
            if pending is not None:
                data = self._decode(queued_for, key, block_hash, pending, discard=False)
                if data is not None:
                    with self._lock:
                        counters = self._stack_counters[self.tiers[queued_for].name]
                        counters.hits += 1
                        counters.bytes_read += len(pending)
                    self._promote(key, pending)
                    return bytes(data)
            for tier_index, tier in enumerate(self.tiers):
                raw = tier.get(key)
                if raw is None:
                    continue
                data = self._decode(tier_index, key, block_hash, raw, discard=True)
                if data is None:
                    continue
                if tier_index > 0:
                    self._promote(key, raw)
                return bytes(data)
            return None
        finally:
            self._load_seconds += time.perf_counter() - start

    @property
    def load_seconds(self) -> float:
        """Cumulative seconds spent in `load`."""
        return self._load_seconds

    # writing pages down

    def offer_computed(self, block_hash: bytes, data: bytes) -> None:
        """A page the engine just cached on the device. "write_through" puts it into every tier (the
        host tier now, the others through the writer) unless the host tier holds it already;
        "on_eviction" does nothing.

        Raises:
            TierConfigError: ``data`` is not ``identity.page_bytes`` long.
        """
        if self.write_policy != "write_through":
            return
        key = self.identity.key(block_hash)
        if self._host is not None and self._host.contains(key):
            return  # offered before, and so written to every tier then
        raw = encode_entry(self.identity, block_hash, data)
        if self._host is not None:
            self._host.put(key, raw)  # what it evicts, the tiers below were given already
        for tier_index in range(self._first_background, len(self.tiers)):
            self._enqueue(tier_index, key, raw)

    def offer_evicted(self, block_hash: bytes, data: bytes) -> None:
        """A page leaving the device pool. "on_eviction" puts it into the first tier that does not
        hold it yet; what the host tier evicts to make room spills to the next tier down (and so on
        down through the writer). "write_through" only puts it into the host tier again (as its
        most recently used entry); the tiers below have it since it was computed.

        Raises:
            TierConfigError: ``data`` is not ``identity.page_bytes`` long.
        """
        key = self.identity.key(block_hash)
        if self.write_policy == "write_through":
            if self._host is not None:
                self._host.put(key, encode_entry(self.identity, block_hash, data))
            return
        for tier_index, tier in enumerate(self.tiers):
            with self._lock:
                queued = self._num_pending[key, tier_index] > 0
            if queued or tier.contains(key):
                continue  # held (or on its way down); try the next tier
            raw = encode_entry(self.identity, block_hash, data)
            if tier is self._host:
                self._spill(tier_index, tier.put(key, raw))
            else:
                self._enqueue(tier_index, key, raw)
            return

    def forget_own_pages(self) -> None:
        """Empty this unit's own tiers, host and disk, once queued writes are done (a prefix-cache reset).
        The store keeps its pages: every instance of the deployment reads it, and one unit's reset is not theirs."""
        self.flush()
        for tier in self.tiers:
            if isinstance(tier, HostTier | DiskTier):
                tier.clear()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every queued write is done: True, or False when ``timeout_s`` passed first."""
        with self._changed:
            return self._changed.wait_for(lambda: self._num_unfinished == 0, timeout=timeout_s)

    # the record

    def counters(self) -> dict[str, TierCounters]:
        """Each tier's cumulative counters by tier name (a snapshot)."""
        with self._lock:
            return {tier.name: _sum(tier.counters, self._stack_counters[tier.name]) for tier in self.tiers}

    def close(self) -> None:
        """Let the writer finish what is queued (up to `CLOSE_FLUSH_TIMEOUT_S`), stop it, close the
        tiers. Writes offered after this are dropped. Idempotent."""
        if self._closed:
            return
        self.flush(CLOSE_FLUSH_TIMEOUT_S)
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        if self._writer is not None:
            self._writer.join(CLOSE_FLUSH_TIMEOUT_S)
        for tier in self.tiers:
            tier.close()
        self._closed = True

    # inside

    def _decode(self, tier_index: int, key: str, block_hash: bytes, raw: bytes, discard: bool) -> memoryview | None:
        tier = self.tiers[tier_index]
        try:
            return decode_entry(self.identity, block_hash, raw)
        except CorruptPageError:
            if discard:
                tier.discard(key)
            with self._lock:
                self._stack_counters[tier.name].corrupt += 1
            return None

    def _promote(self, key: str, raw: bytes) -> None:
        """Put a page found below the host tier into it; under "on_eviction" what that evicts spills down."""
        if self._host is None:
            return
        evicted = self._host.put(key, raw)
        self._spill(0, [(old_key, old_raw) for old_key, old_raw in evicted if old_key != key])

    def _spill(self, tier_index: int, evicted: list[tuple[str, bytes]]) -> None:
        """What tier ``tier_index`` evicted goes to the next tier down ("on_eviction"; under
        "write_through" the tiers below hold it already)."""
        if self.write_policy != "on_eviction" or tier_index + 1 >= len(self.tiers):
            return
        for key, raw in evicted:
            self._enqueue(tier_index + 1, key, raw)

    def _enqueue(self, tier_index: int, key: str, raw: bytes) -> None:
        with self._changed:
            if self._closing or self._queued_bytes + len(raw) > self.max_queued_bytes:
                self._stack_counters[self.tiers[tier_index].name].dropped_writes += 1
                return
            self._queue.append(_Write(tier_index, key, raw))
            self._queued_bytes += len(raw)
            self._num_unfinished += 1
            self._pending[key] = raw
            self._num_pending[key, tier_index] += 1
            self._changed.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                write = self._queue.popleft()
                self._queued_bytes -= len(write.raw)
            try:
                self._write_down(write.tier_index, write.key, write.raw)
            except Exception:  # noqa: BLE001 - a tier's bug must not stop the writer: counted, the write lost
                with self._lock:
                    self._stack_counters[self.tiers[write.tier_index].name].errors += 1
            finally:
                with self._changed:
                    self._num_unfinished -= 1
                    self._num_pending[write.key, write.tier_index] -= 1
                    if not self._num_pending[write.key, write.tier_index]:
                        del self._num_pending[write.key, write.tier_index]
                        if not any(self._num_pending[write.key, i] for i in range(len(self.tiers))):
                            del self._pending[write.key]
                    self._changed.notify_all()

    def _write_down(self, tier_index: int, key: str, raw: bytes) -> None:
        """On the writer thread: ``raw`` into tier ``tier_index`` unless it holds the key already (one
        key is one page's bytes); under "on_eviction" what it evicts goes on down, on this thread."""
        tier = self.tiers[tier_index]
        if tier.contains(key):
            return
        evicted = tier.put(key, raw)
        if self.write_policy == "on_eviction" and tier_index + 1 < len(self.tiers):
            for old_key, old_raw in evicted:
                self._write_down(tier_index + 1, old_key, old_raw)


def _sum(a: TierCounters, b: TierCounters) -> TierCounters:
    return TierCounters(**{field.name: getattr(a, field.name) + getattr(b, field.name)
                           for field in dataclasses.fields(TierCounters)})
