"""The host tier: an LRU by bytes that hands back what it evicts, oldest first."""

from __future__ import annotations

import pytest

from disaggsdk.kv.tiers.base import TierConfigError
from disaggsdk.kv.tiers.host_tier import HostTier


def test_evicts_least_recently_used_by_bytes_and_returns_them_in_order():
    tier = HostTier(capacity_bytes=100)
    assert tier.put("a", b"a" * 40) == []
    assert tier.put("b", b"b" * 40) == []
    assert tier.get("a") == b"a" * 40  # a is now the most recently used
    assert tier.put("c", b"c" * 60) == [("b", b"b" * 40)]
    assert tier.used_bytes == 100 and tier.contains("a") and tier.contains("c") and not tier.contains("b")
    assert tier.put("d", b"d" * 70) == [("a", b"a" * 40), ("c", b"c" * 60)]
    assert tier.counters.evictions == 3 and tier.counters.hits == 1
    assert tier.get("b") is None and tier.counters.misses == 1
    assert tier.counters.bytes_written == 210 and tier.counters.bytes_read == 40


def test_replacing_a_key_counts_its_bytes_once_and_a_too_big_entry_is_returned():
    tier = HostTier(capacity_bytes=100)
    tier.put("a", b"x" * 60)
    assert tier.put("a", b"y" * 80) == []
    assert tier.used_bytes == 80 and tier.get("a") == b"y" * 80
    assert tier.put("a", b"z" * 101) == [("a", b"z" * 101)]
    assert not tier.contains("a") and tier.used_bytes == 0
    tier.put("b", b"b")
    tier.discard("b")
    tier.discard("never")
    assert tier.used_bytes == 0


def test_a_negative_capacity_is_refused():
    with pytest.raises(TierConfigError, match="capacity_bytes"):
        HostTier(-1)
