"""Rank pools: a registry of the memory a rank's KV pool lives in, and factories that import the
chosen twin lazily.

``memfd`` (`shared_memory.SharedRegion`) runs anywhere and is the test oracle; ``cuda``
(`cuda_vmm`: cuMem with a POSIX-fd handle) needs a CUDA driver and cuda-python, imported on first
use only. A rank on ``device`` "cpu" allocates the first, on "cuda[:N]" the second; the head maps
each by the kind its fd message names (`rank_pool.recv_rank_pool`). Both meet `base.RankPool`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from disaggsdk.kv.pools.base import PoolTwin, RankPool

# kind -> the module of its twin (a `base.PoolTwin`)
POOLS = {
    "memfd": "disaggsdk.kv.pools.shared_memory",
    "cuda": "disaggsdk.kv.pools.cuda_vmm",
}


def cuda_ordinal(device: str) -> int | None:
    """The CUDA ordinal a torch device string names: None for "cpu", the index of "cuda:N", and the
    current device for a bare "cuda" (which a tp rank set to its own with ``torch.cuda.set_device``)."""
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    if index:
        return int(index)
    import torch

    return int(torch.cuda.current_device())


def pool_kind(device: str) -> str:
    """The kind of pool (a key of ``POOLS``) a rank on the torch device ``device`` allocates."""
    return "cuda" if device.startswith("cuda") else "memfd"


def pool_twin(kind: str) -> PoolTwin:
    """The twin module of ``kind`` (a key of ``POOLS``), imported now.

    Raises:
        KeyError: an unknown kind.
    """
    return cast("PoolTwin", importlib.import_module(POOLS[kind]))


def create_rank_pool(size_bytes: int, device: str, name: str) -> RankPool:
    """Allocate a shareable pool of at least ``size_bytes`` on ``device``.

    Args:
        size_bytes: what the pool's format needs (`KVPageFormat.pool_bytes`).
        device: "cpu" (a memfd) or "cuda[:N]" (cuMem, POSIX-fd handle type).
        name: the memfd's name (shows in /proc/PID/fd); unused for CUDA.
    Raises:
        SharedMemoryError: the memory cannot be allocated (CudaDriverMissing: no CUDA driver or cuda-python).
    """
    return pool_twin(pool_kind(device)).allocate_pool(size_bytes, cuda_ordinal(device), name)
