"""The disk tier: whole 4096-byte files, found again after a restart, evicted LRU within capacity,
and failures that are misses and dropped writes, never exceptions."""

from __future__ import annotations

import os

import pytest

from disaggsdk.kv.tiers.base import TierConfigError
from disaggsdk.kv.tiers.disk_tier import BLOCK_BYTES, ENTRY_SUFFIX, DiskTier, padded_bytes
from disaggsdk.kv.tiers.page_entry import CorruptPageError, decode_entry, encode_entry
from tests.kv.tiers.conftest import page


def _entries(identity, *indices):
    out = []
    for i in indices:
        block_hash, data = page(i)
        out.append((identity.key(block_hash), encode_entry(identity, block_hash, data)))
    return out


def test_files_are_whole_blocks_and_read_back_without_padding(tmp_path, identity):
    tier = DiskTier(tmp_path, capacity_bytes=10 * BLOCK_BYTES)
    [(key, raw)] = _entries(identity, 1)
    assert tier.put(key, raw) == []
    files = list(tmp_path.iterdir())
    assert [f.name for f in files] == [key + ENTRY_SUFFIX]
    assert files[0].stat().st_size == padded_bytes(len(raw)) and files[0].stat().st_size % BLOCK_BYTES == 0
    assert tier.used_bytes == padded_bytes(len(raw))
    assert tier.get(key) == raw
    assert tier.counters.hits == 1 and tier.counters.bytes_written == len(raw) == tier.counters.bytes_read


def test_a_new_tier_on_the_same_directory_finds_the_entries_in_lru_order(tmp_path, identity):
    entries = _entries(identity, 1, 2, 3)
    tier = DiskTier(tmp_path, capacity_bytes=10 * BLOCK_BYTES)
    for key, raw in entries:
        tier.put(key, raw)
    tier.get(entries[0][0])  # 1 becomes the most recently used: 2, 3, 1
    (tmp_path / ".leftover.tmp").write_bytes(b"half an entry")  # a crash mid-write
    tier.close()
    again = DiskTier(tmp_path, capacity_bytes=3 * padded_bytes(len(entries[0][1])))
    assert not (tmp_path / ".leftover.tmp").exists()
    assert all(again.contains(key) for key, _ in entries)
    assert again.get(entries[1][0]) == entries[1][1]  # 3, 1, 2
    [(new_key, new_raw)] = _entries(identity, 4)
    assert again.put(new_key, new_raw) == [entries[2]]  # 3 was the least recently used
    assert not again.contains(entries[2][0]) and not any(tmp_path.glob(entries[2][0] + "*"))


def test_capacity_evicts_least_recently_used_and_deletes_their_files(tmp_path, identity):
    entries = _entries(identity, 1, 2, 3)
    file_bytes = padded_bytes(len(entries[0][1]))
    tier = DiskTier(tmp_path, capacity_bytes=2 * file_bytes)
    assert tier.put(*entries[0]) == [] and tier.put(*entries[1]) == []
    assert tier.put(*entries[2]) == [entries[0]]
    assert tier.used_bytes == 2 * file_bytes and tier.counters.evictions == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(k + ENTRY_SUFFIX for k, _ in entries[1:])
    small = DiskTier(tmp_path, capacity_bytes=file_bytes)  # reopened smaller: the oldest goes
    assert [p.name for p in tmp_path.iterdir()] == [entries[2][0] + ENTRY_SUFFIX]
    assert small.put("too-big", b"x" * (file_bytes + 1)) == [("too-big", b"x" * (file_bytes + 1))]


def test_a_damaged_file_reads_back_as_it_is_for_the_reader_to_refuse(tmp_path, identity):
    tier = DiskTier(tmp_path, capacity_bytes=10 * BLOCK_BYTES)
    [(key, raw)] = _entries(identity, 1)
    tier.put(key, raw)
    path = tmp_path / (key + ENTRY_SUFFIX)
    path.write_bytes(b"garbage" * 10)
    assert tier.get(key) == b"garbage" * 10
    block_hash, _ = page(1)
    with pytest.raises(CorruptPageError, match="magic"):
        decode_entry(identity, block_hash, tier.get(key))


def test_io_errors_are_misses_and_dropped_writes(tmp_path, identity):
    tier = DiskTier(tmp_path / "pages", capacity_bytes=10 * BLOCK_BYTES)
    [(key, raw)] = _entries(identity, 1)
    tier.put(key, raw)
    (tmp_path / "pages" / (key + ENTRY_SUFFIX)).unlink()  # gone behind its back: a miss, dropped from the index
    assert tier.get(key) is None and not tier.contains(key) and tier.used_bytes == 0
    (tmp_path / "pages" / (key + ENTRY_SUFFIX)).mkdir()  # a directory where its file should go
    assert tier.put(key, raw) == []
    assert tier.counters.errors == 1 and tier.counters.dropped_writes == 1 and not tier.contains(key)
    assert [p.name for p in (tmp_path / "pages").iterdir()] == [key + ENTRY_SUFFIX]  # no temporary file left


def test_bad_keys_and_paths_are_config_errors(tmp_path):
    tier = DiskTier(tmp_path, capacity_bytes=BLOCK_BYTES)
    with pytest.raises(TierConfigError, match="key"):
        tier.put("../escape", b"x")
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(TierConfigError, match="writable directory"):
        DiskTier(tmp_path / "file", capacity_bytes=BLOCK_BYTES)
    assert os.listdir(tmp_path) == ["file"]
