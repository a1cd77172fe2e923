"""Shared by the KV tier tests: a page identity, pages of it, and a store server started per test."""

from __future__ import annotations

import shutil

import pytest

from disaggsdk.kv.block_hash import page_hashes
from disaggsdk.kv.tiers.page_entry import PageIdentity

PAGE_BYTES = 3000  # not a multiple of 4096: the disk tier pads


@pytest.fixture
def identity() -> PageIdentity:
    return PageIdentity(model="qwen3-coder-tiny@seed0", layout="HND", dtype="float32", page_size=4,
                        tp_rank=0, tp_size=1, page_bytes=PAGE_BYTES)


def page(i: int, num_bytes: int = PAGE_BYTES) -> tuple[bytes, bytes]:
    """The block hash and data of test page ``i``."""
    block_hash = page_hashes(list(range(i * 4, i * 4 + 4)), 4)[0]
    return block_hash, bytes((i + j) % 251 for j in range(num_bytes))


@pytest.fixture
def kv_store():
    """A redis-server started by `start_kv_store` (8 MiB), stopped after the test."""
    from disaggsdk.launch.kv_store_server import start_kv_store

    if not (shutil.which("redis-server") or shutil.which("valkey-server")):
        pytest.skip("redis-server is not installed: apt-get install redis-server (make sysdeps-test does it)")
    server = start_kv_store(8 * 2**20)
    try:
        yield server
    finally:
        server.stop()
