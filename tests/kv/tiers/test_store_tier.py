"""The store tier against a real redis-server: two clients (two instances) share its entries, and a
server that dies costs misses and dropped writes, never an exception, until it is back."""

from __future__ import annotations

import time

import pytest

from disaggsdk.kv.tiers.base import TierConfigError
from disaggsdk.kv.tiers.page_entry import encode_entry
from disaggsdk.kv.tiers.store_tier import FIRST_BACKOFF_S, StoreTier, split_address
from disaggsdk.launch.kv_store_server import start_kv_store
from tests.kv.tiers.conftest import page


def _entry(identity, i):
    block_hash, data = page(i)
    return identity.key(block_hash), encode_entry(identity, block_hash, data)


def test_two_clients_share_entries_under_one_namespace(kv_store, identity):
    writer = StoreTier(kv_store.address, kv_store.maxmemory_bytes, namespace="deployment-a")
    reader = StoreTier(kv_store.address, kv_store.maxmemory_bytes, namespace="deployment-a")
    stranger = StoreTier(kv_store.address, kv_store.maxmemory_bytes, namespace="deployment-b")
    try:
        key, raw = _entry(identity, 1)
        assert not reader.contains(key) and reader.get(key) is None
        assert writer.put(key, raw) == []
        assert reader.contains(key) and reader.get(key) == raw
        assert not stranger.contains(key) and stranger.get(key) is None  # another namespace
        reader.discard(key)
        assert not writer.contains(key)
        assert writer.counters.bytes_written == len(raw) and reader.counters.hits == 1 and reader.counters.misses == 1
        assert writer.used_bytes > 0
        assert writer.counters.errors == reader.counters.errors == 0
    finally:
        for tier in (writer, reader, stranger):
            tier.close()


def test_a_dead_server_costs_misses_and_drops_then_the_tier_reconnects(kv_store, identity):
    tier = StoreTier(kv_store.address, kv_store.maxmemory_bytes, namespace="ns", timeout_s=0.5)
    key, raw = _entry(identity, 1)
    tier.put(key, raw)
    kv_store.process.kill()  # a crash
    kv_store.process.wait()
    try:
        assert tier.get(key) is None  # fails once, then backs off
        assert tier.counters.errors == 1 and not tier.reachable
        for _ in range(100):  # while backing off no call is made (no more errors): no wait per page
            assert tier.get(key) is None and not tier.contains(key)
            assert tier.put(key, raw) == []
        assert tier.counters.errors == 1 and tier.counters.dropped_writes == 100 and tier.counters.misses == 101
        assert tier.used_bytes == 0
        with start_kv_store(kv_store.maxmemory_bytes, port=kv_store.port) as again:  # back on the same port, empty
            deadline = time.monotonic() + 5 * FIRST_BACKOFF_S
            while not tier.reachable and time.monotonic() < deadline:
                time.sleep(0.05)
            assert tier.put(key, raw) == [] and tier.reachable
            assert tier.get(key) == raw
            assert tier.counters.errors == 1
            again.stop()
    finally:
        tier.close()


def test_the_server_evicts_least_recently_used_entries_past_maxmemory(kv_store, identity):
    tier = StoreTier(kv_store.address, kv_store.maxmemory_bytes, namespace="lru")
    try:
        keys = []
        for i in range(8 * 2**20 // 3000 * 2):  # twice maxmemory
            key, raw = _entry(identity, i % 64)
            key = f"{key}-{i}"
            tier.put(key, raw)
            keys.append(key)
        assert tier.counters.errors == 0 and tier.contains(keys[-1]) and not tier.contains(keys[0])
    finally:
        tier.close()


def test_bad_addresses_and_arguments_are_config_errors():
    assert split_address("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert split_address("[::1]:6379") == ("::1", 6379)
    for bad in ("localhost", ":6379", "host:port", "host:0", "host:70000"):
        with pytest.raises(TierConfigError, match="host:port"):
            split_address(bad)
    with pytest.raises(TierConfigError, match="namespace"):
        StoreTier("127.0.0.1:6379", 0, namespace="")
    with pytest.raises(TierConfigError, match="timeout_s"):
        StoreTier("127.0.0.1:6379", 0, namespace="ns", timeout_s=0)
