"""The contract of a rank's KV pool memory, which its host (memfd) and CUDA (cuMem) twins both meet.

Every tp rank computes into its own pool, and one transfer engine in the instance head registers
them all (docs/architecture.md, "Shared KV memory"). A pool is allocated by its rank on its device
and mapped again by the head from an fd (`rank_pool.send_rank_pool`); `RankPool` is what the engine
and the head need of either twin, `PoolTwin` what the registry (`disaggsdk.kv.pools`) needs of a
twin's module to allocate one and to map a received one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    import torch


class SharedMemoryError(DisaggError):
    """Shared memory cannot be created, mapped, passed or released."""


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


class PoolTwin(Protocol):
    """What a twin's module offers the registry (`shared_memory` on the host, `cuda_vmm` on a GPU)."""

    def allocate_pool(self, size_bytes: int, device: int | None, name: str) -> RankPool:
        """A shareable pool of at least ``size_bytes`` on CUDA ordinal ``device`` (None: host memory),
        named ``name`` where the memory has a name (a memfd's, in /proc/PID/fd).

        Raises:
            SharedMemoryError: the memory cannot be allocated.
        """

    def map_pool(self, fd: int, size_bytes: int, device: int | None) -> RankPool:
        """Map the pool another process sent as ``fd`` (this takes ownership of the fd).

        Raises:
            SharedMemoryError: the fd cannot be mapped here.
        """
