"""start_kv_store: a memory-only, LRU-evicting redis-server on loopback, stopped for good."""

from __future__ import annotations

import socket

import pytest

from disaggsdk.launch import kv_store_server
from disaggsdk.launch.kv_store_server import KVStoreServerError, start_kv_store


def _command(address: str, *words: str) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as s:
        s.sendall(b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w.encode()) for w in words))
        return s.recv(4096)


def test_the_server_is_memory_only_lru_on_loopback_and_stops(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with start_kv_store(4 * 2**20) as server:
        assert server.address.startswith("127.0.0.1:") and server.alive()
        assert b"allkeys-lru" in _command(server.address, "CONFIG", "GET", "maxmemory-policy")
        assert b"4194304" in _command(server.address, "CONFIG", "GET", "maxmemory")
        assert _command(server.address, "CONFIG", "GET", "save").endswith(b"$0\r\n\r\n")  # no snapshots
        assert b"no" in _command(server.address, "CONFIG", "GET", "appendonly")
        with pytest.raises(KVStoreServerError, match="taken by another server"):
            start_kv_store(2**20, port=server.port)
    assert not server.alive()
    server.stop()  # idempotent
    assert list(tmp_path.iterdir()) == []  # wrote nothing where it was started


def test_no_server_binary_says_how_to_install_one(monkeypatch):
    monkeypatch.setattr(kv_store_server.shutil, "which", lambda name: None)
    with pytest.raises(KVStoreServerError, match="apt-get install redis-server"):
        start_kv_store(2**20)


def test_a_zero_maxmemory_is_refused():
    with pytest.raises(KVStoreServerError, match="maxmemory_bytes"):
        start_kv_store(0)
