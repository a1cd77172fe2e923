"""memfd regions shared between real processes through SCM_RIGHTS."""

from __future__ import annotations

import multiprocessing
import socket

import pytest

from disaggsdk.kv.pools.base import SharedMemoryError
from disaggsdk.kv.pools.fd_passing import KIND_CUDA, recv_fd, recv_region, send_fd, send_region
from disaggsdk.kv.pools.shared_memory import SharedRegion


def _child_writes(sock: socket.socket) -> None:
    region = recv_region(sock)
    region.buffer[100:105] = b"hello"
    region.close()
    sock.send(b"k")


def test_child_writes_into_parent_region():
    ctx = multiprocessing.get_context("spawn")
    parent, child = socket.socketpair()
    proc = ctx.Process(target=_child_writes, args=(child,), daemon=True)
    try:
        with SharedRegion.create(1 << 16) as region:
            proc.start()
            child.close()
            send_region(parent, region)
            parent.settimeout(60)
            assert parent.recv(1) == b"k"
            assert bytes(region.buffer[98:107]) == b"\0\0hello\0\0"
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        parent.close()
        child.close()


def test_address_and_close():
    region = SharedRegion.create(4096)
    assert region.address != 0 and region.size_bytes == 4096 and len(region.buffer) == 4096
    view = region.buffer[0:8]  # an outstanding view keeps the mapping alive
    with pytest.raises(SharedMemoryError, match="still in use"):
        region.close()
    view.release()
    region.close()
    region.close()  # idempotent


def test_torch_view_shares_memory():
    torch = pytest.importorskip("torch")
    region = SharedRegion.create(64)
    t = region.as_tensor(torch.int32)
    t[1] = 0x01020304
    assert bytes(region.buffer[4:8]) == b"\x04\x03\x02\x01"
    del t
    region.close()


def test_bad_sizes_and_messages():
    with pytest.raises(SharedMemoryError, match="positive"):
        SharedRegion.create(0)
    a, b = socket.socketpair()
    try:
        with SharedRegion.create(4096) as region:
            with pytest.raises(SharedMemoryError, match="cannot map"):
                send_fd(a, region.fd, 8192)  # claims more than the fd holds
                recv_region(b)
            send_fd(a, region.fd, 4096, KIND_CUDA)
            with pytest.raises(SharedMemoryError, match="host-memory"):
                recv_region(b)
            a.close()
            with pytest.raises(SharedMemoryError, match="did the peer exit"):
                recv_fd(b)
    finally:
        a.close()
        b.close()
