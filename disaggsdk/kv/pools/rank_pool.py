"""A rank's KV pool on the wire: its fd, size, kind and device, sent to another process of its
instance, which maps the same memory.

Every tp rank computes into its own pool (`base.RankPool`; allocated with
`disaggsdk.kv.pools.create_rank_pool`), and one transfer engine in the instance head registers
them all (docs/architecture.md, "Shared KV memory"). Both twins pass over a Unix socket with
SCM_RIGHTS (`fd_passing`), whose header names the kind and the device, so the receiving side maps
each with its own twin (`base.PoolTwin.map_pool`).
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from disaggsdk.kv.pools import pool_twin
from disaggsdk.kv.pools.base import SharedMemoryError
from disaggsdk.kv.pools.fd_passing import KIND_CUDA, KIND_MEMFD, recv_fd, send_fd

if TYPE_CHECKING:
    from disaggsdk.kv.pools.base import RankPool

# the fd header's kind -> the registry's (`disaggsdk.kv.pools.POOLS`)
POOL_KIND_OF_FD_KIND = {KIND_MEMFD: "memfd", KIND_CUDA: "cuda"}


def send_rank_pool(sock: socket.socket, pool: RankPool) -> None:
    """Send ``pool``'s fd, size, kind and device so the peer maps the same memory (`recv_rank_pool`).

    Raises:
        SharedMemoryError: the pool has no fd to share, or the peer went away.
    """
    if pool.fd < 0:
        raise SharedMemoryError("this pool has no fd to send: only the rank that allocated it can share it")
    device = pool.cuda_device
    send_fd(sock, pool.fd, pool.size_bytes, KIND_MEMFD if device is None else KIND_CUDA, -1 if device is None else device)


def recv_rank_pool(sock: socket.socket) -> RankPool:
    """Receive a pool sent with `send_rank_pool` and map it here: a memfd with mmap, a CUDA allocation
    with cuMemImportFromShareableHandle + cuMemMap + cuMemSetAccess on the sender's device.

    Raises:
        SharedMemoryError: an unknown kind, a bad message, or the mapping failed.
    """
    fd, size_bytes, kind, device = recv_fd(sock)
    if kind not in POOL_KIND_OF_FD_KIND:
        os.close(fd)
        raise SharedMemoryError(f"unknown shared-memory kind {kind}: both ends must run the same disaggsdk")
    return pool_twin(POOL_KIND_OF_FD_KIND[kind]).map_pool(fd, size_bytes, None if kind == KIND_MEMFD else device)
