"""A rank's KV pool memory, host or CUDA, that another process of its instance can map.

Every tp rank computes into its own pool, and one transfer engine in the instance head registers
them all (docs/architecture.md, "Shared KV memory"). On the CPU a pool is a memfd
(`SharedRegion`); on a GPU a cuMem allocation exported as a POSIX fd
(`cuda_vmm.CudaSharedAllocation`, imported by the head as `CudaSharedMapping`). Both pass over a
Unix socket with SCM_RIGHTS (`fd_passing`), whose header names the kind and the device, so the
receiving side maps each the right way. `RankPool` is what the engine and the head need of either.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Protocol

from disaggsdk.memory.fd_passing import KIND_CUDA, KIND_MEMFD, recv_fd, send_fd
from disaggsdk.memory.shared_memory import SharedMemoryError, SharedRegion

if TYPE_CHECKING:
    import torch


class RankPool(Protocol):
    """One rank's KV pool memory, mapped in this process."""

    @property
    def size_bytes(self) -> int:
        """Bytes of the pool (at least what was asked: a CUDA pool is rounded up to its granularity)."""

    @property
    def fd(self) -> int:
        """The fd another process maps it from, or -1 once handed over or imported."""

    @property
    def cuda_device(self) -> int | None:
        """The CUDA device ordinal holding the memory; None for host memory."""

    def as_tensor(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The whole pool as a tensor on its device (uint8 unless ``dtype``), sharing its memory."""

    def close(self) -> None:
        """Unmap and release the memory (the tensors over it must be gone)."""


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


def create_rank_pool(size_bytes: int, device: str, name: str) -> RankPool:
    """Allocate a shareable pool of at least ``size_bytes`` on ``device``.

    Args:
        size_bytes: what the pool's format needs (`KVPageFormat.pool_bytes`).
        device: "cpu" (a memfd) or "cuda[:N]" (cuMem, POSIX-fd handle type).
        name: the memfd's name (shows in /proc/PID/fd); unused for CUDA.
    Raises:
        SharedMemoryError: the memory cannot be allocated (CudaDriverMissing: no CUDA driver or cuda-python).
    """
    ordinal = cuda_ordinal(device)
    if ordinal is None:
        return SharedRegion.create(size_bytes, name)
    from disaggsdk.memory.cuda_vmm import CudaSharedAllocation

    return CudaSharedAllocation.create(size_bytes, device=ordinal)


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
    if kind == KIND_MEMFD:
        return SharedRegion.from_fd(fd, size_bytes)
    if kind == KIND_CUDA:
        from disaggsdk.memory.cuda_vmm import CudaSharedMapping

        return CudaSharedMapping.import_fd(fd, size_bytes, device)
    import os

    os.close(fd)
    raise SharedMemoryError(f"unknown shared-memory kind {kind}: both ends must run the same disaggsdk")
