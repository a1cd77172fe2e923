"""TierStack: the write policies, spills down the tiers, promotion, corrupt copies skipped, the
writer's queue (seen by loads, bounded, flushed) and a dead store that costs only misses."""

from __future__ import annotations

import socket
import threading

import pytest

from disaggsdk.kv.tiers.base import TierConfigError
from disaggsdk.kv.tiers.disk_tier import ENTRY_SUFFIX, DiskTier, padded_bytes
from disaggsdk.kv.tiers.host_tier import HostTier
from disaggsdk.kv.tiers.page_entry import encode_entry
from disaggsdk.kv.tiers.store_tier import StoreTier
from disaggsdk.kv.tiers.tier_stack import TierStack
from tests.kv.tiers.conftest import page


def _entry_bytes(identity) -> int:
    block_hash, data = page(0)
    return len(encode_entry(identity, block_hash, data))


class GatedTier(HostTier):
    """A host tier under another name whose writes wait for ``gate``: a slow disk, to see the queue."""

    def __init__(self, name: str, capacity_bytes: int):
        super().__init__(capacity_bytes)
        self.name = name
        self.gate = threading.Event()
        self.writing = threading.Event()

    def put(self, key, raw):
        self.writing.set()
        self.gate.wait(10)
        return super().put(key, raw)


def test_write_through_puts_computed_pages_in_every_tier(tmp_path, identity):
    host, disk = HostTier(10 * _entry_bytes(identity)), DiskTier(tmp_path, 10 * padded_bytes(_entry_bytes(identity)))
    stack = TierStack(identity, [host, disk], "write_through")
    try:
        pages = [page(i) for i in range(3)]
        for block_hash, data in pages:
            stack.offer_computed(block_hash, data)
        assert stack.flush()
        for block_hash, _ in pages:
            assert host.contains(identity.key(block_hash)) and disk.contains(identity.key(block_hash))
        assert stack.num_cached_prefix([h for h, _ in pages]) == 3
        assert stack.load(pages[1][0]) == pages[1][1]
        stack.offer_evicted(*page(7))  # write_through: into the host tier only
        assert stack.flush() and host.contains(identity.key(page(7)[0])) and not disk.contains(identity.key(page(7)[0]))
        counters = stack.counters()
        assert counters["host"].hits == 1 and counters["disk"].bytes_written == 3 * _entry_bytes(identity)
        assert stack.load_seconds > 0
    finally:
        stack.close()


def test_on_eviction_fills_the_first_tier_and_spills_what_it_evicts_down(tmp_path, identity):
    entry = _entry_bytes(identity)
    host = HostTier(2 * entry)
    disk = DiskTier(tmp_path, 2 * padded_bytes(entry))
    last = HostTier(10 * entry)
    last.name = "store"  # the last tier: an in-memory one stands in for the shared store here
    stack = TierStack(identity, [host, disk, last], "on_eviction")
    try:
        pages = [page(i) for i in range(5)]
        stack.offer_computed(*pages[0])  # on_eviction: nothing yet
        assert stack.flush() and stack.num_cached_prefix([pages[0][0]]) == 0
        for block_hash, data in pages:
            stack.offer_evicted(block_hash, data)
        assert stack.flush()
        keys = [identity.key(h) for h, _ in pages]
        # host keeps the newest two, disk the two before, the store the oldest
        assert [host.contains(k) for k in keys] == [False, False, False, True, True]
        assert [disk.contains(k) for k in keys] == [False, True, True, False, False]
        assert [last.contains(k) for k in keys] == [True, False, False, False, False]
        assert stack.num_cached_prefix([h for h, _ in pages]) == 5
        assert stack.num_cached_prefix([pages[0][0], page(9)[0], pages[1][0]]) == 1
        # evicted again while the host tier holds it: it goes to the first tier lacking it
        stack.offer_evicted(*pages[4])
        assert stack.flush() and disk.contains(keys[4])
        assert all(stack.load(h) == d for h, d in pages)
    finally:
        stack.close()


def test_a_copy_found_below_is_promoted_to_the_host_tier(tmp_path, identity):
    block_hash, data = page(1)
    disk = DiskTier(tmp_path, 10 * padded_bytes(_entry_bytes(identity)))
    disk.put(identity.key(block_hash), encode_entry(identity, block_hash, data))  # a restarted unit's disk
    host = HostTier(10 * _entry_bytes(identity))
    stack = TierStack(identity, [host, disk], "on_eviction")
    try:
        assert stack.load(block_hash) == data
        assert host.contains(identity.key(block_hash))
        assert stack.load(block_hash) == data
        counters = stack.counters()
        assert counters["disk"].hits == 1 and counters["host"].hits == 1 and counters["host"].misses == 1
        assert stack.load(page(2)[0]) is None
    finally:
        stack.close()


def test_a_corrupt_file_is_counted_discarded_and_the_next_tier_answers(tmp_path, identity):
    block_hash, data = page(1)
    key = identity.key(block_hash)
    raw = encode_entry(identity, block_hash, data)
    disk = DiskTier(tmp_path, 10 * padded_bytes(len(raw)))
    below = HostTier(10 * len(raw))
    below.name = "store"
    disk.put(key, raw)
    below.put(key, raw)
    damaged = bytearray((tmp_path / (key + ENTRY_SUFFIX)).read_bytes())
    damaged[len(raw) - 1] ^= 0xFF  # the page's last byte
    (tmp_path / (key + ENTRY_SUFFIX)).write_bytes(bytes(damaged))
    stack = TierStack(identity, [disk, below], "on_eviction")
    try:
        assert stack.load(block_hash) == data  # the store's good copy
        assert stack.counters()["disk"].corrupt == 1 and not disk.contains(key)
        assert not (tmp_path / (key + ENTRY_SUFFIX)).exists()
    finally:
        stack.close()
    (tmp_path / (key + ENTRY_SUFFIX)).write_bytes(bytes(damaged))
    alone = TierStack(identity, [DiskTier(tmp_path, 10 * padded_bytes(len(raw)))], "on_eviction")
    try:
        assert alone.load(block_hash) is None  # no good copy anywhere
        assert alone.counters()["disk"].corrupt == 1
    finally:
        alone.close()


def test_a_page_whose_write_is_queued_loads_from_the_queue_and_flush_waits_for_it(identity):
    entry = _entry_bytes(identity)
    host, disk = HostTier(entry), GatedTier("disk", 10 * entry)
    stack = TierStack(identity, [host, disk], "on_eviction")
    try:
        first, second = page(1), page(2)
        stack.offer_evicted(*first)
        stack.offer_evicted(*second)  # evicts the first from the host tier: queued for the disk
        assert disk.writing.wait(10)
        assert not stack.flush(timeout_s=0.05)
        assert stack.num_cached_prefix([first[0], second[0]]) == 2
        assert stack.load(first[0]) == first[1]  # from the queue
        assert stack.counters()["disk"].hits == 1
        disk.gate.set()
        assert stack.flush()
        assert disk.contains(identity.key(first[0]))
    finally:
        disk.gate.set()
        stack.close()


def test_a_full_queue_drops_writes_and_counts_them(identity):
    entry = _entry_bytes(identity)
    disk = GatedTier("disk", 100 * entry)
    stack = TierStack(identity, [disk], "write_through", max_queued_bytes=2 * entry)
    try:
        stack.offer_computed(*page(0))
        assert disk.writing.wait(10)  # the writer holds page 0; the queue is empty again
        for i in range(1, 5):
            stack.offer_computed(*page(i))
        assert stack.counters()["disk"].dropped_writes == 2
        disk.gate.set()
        assert stack.flush()
        assert [disk.contains(identity.key(page(i)[0])) for i in range(5)] == [True, True, True, False, False]
    finally:
        disk.gate.set()
        stack.close()
    stack.offer_computed(*page(9))  # after close: dropped
    assert stack.counters()["disk"].dropped_writes == 3
    stack.close()  # idempotent


def test_a_dead_store_costs_misses_and_dropped_writes_only(identity):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once closed
    entry = _entry_bytes(identity)
    store = StoreTier(dead, 2**20, namespace="ns", timeout_s=0.2)
    stack = TierStack(identity, [HostTier(entry), store], "on_eviction")
    try:
        for i in range(4):
            stack.offer_evicted(*page(i))
        assert stack.flush()
        assert stack.load(page(0)[0]) is None and stack.load(page(3)[0]) == page(3)[1]
        counters = stack.counters()["store"]
        assert counters.errors >= 1 and counters.dropped_writes == 3 and counters.hits == 0  # every spill of pages 0-2
    finally:
        stack.close()


def test_the_store_tier_in_a_stack_shares_pages_between_two_instances(kv_store, identity):
    def instance() -> TierStack:
        return TierStack(identity, [HostTier(2**20), StoreTier(kv_store.address, 2**20, namespace="dep")], "write_through")

    a, b = instance(), instance()
    try:
        a.offer_computed(*page(1))
        assert a.flush()
        assert b.num_cached_prefix([page(1)[0], page(2)[0]]) == 1
        assert b.load(page(1)[0]) == page(1)[1]
        assert b.counters()["store"].hits == 1
    finally:
        a.close()
        b.close()


def test_a_wrong_stack_is_a_config_error(tmp_path, identity):
    host, disk = HostTier(1), DiskTier(tmp_path, 1)
    with pytest.raises(TierConfigError, match="first"):
        TierStack(identity, [disk, host], "on_eviction")
    with pytest.raises(TierConfigError, match="once"):
        TierStack(identity, [host, host], "on_eviction")
    with pytest.raises(TierConfigError, match="write_policy"):
        TierStack(identity, [host], "sometimes")  # type: ignore[arg-type]
    empty = TierStack(identity, [], "write_through")
    empty.offer_computed(*page(1))
    assert empty.load(page(1)[0]) is None and empty.flush() and empty.counters() == {}
    empty.close()
