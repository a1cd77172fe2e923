"""Shareable host memory for the KV pool: a memfd, mapped, passable to other processes by fd.

The host twin of a rank's KV pool (`disaggsdk.kv.pools.base.RankPool`; its CUDA twin is
`cuda_vmm`). A rank creates a `SharedRegion`, sends its fd to the head process over a Unix socket
(`disaggsdk.kv.pools.fd_passing`), and the head maps the same pages with `SharedRegion.from_fd`
and registers them with its transfer engine. No numpy or torch needed: the view is a
memoryview; `as_tensor` imports torch only when called.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import TYPE_CHECKING

from disaggsdk.kv.pools.base import SharedMemoryError

if TYPE_CHECKING:
    import torch


class SharedRegion:
    """A memfd-backed region mapped read-write in this process; owns the fd and the mapping.

    It is the host form of a rank's KV pool (`disaggsdk.kv.pools.base.RankPool`); a CUDA
    pool is `cuda_vmm.CudaSharedAllocation`.

    Args:
        fd: a memfd (or any mappable fd); the region takes ownership and closes it.
        size_bytes: bytes to map, or None for the file's size.
    """

    cuda_device: int | None = None  # host memory (the RankPool contract)

    def __init__(self, fd: int, size_bytes: int | None = None):
        try:
            file_size = os.fstat(fd).st_size
            size = file_size if size_bytes is None else size_bytes
            if size <= 0 or size > file_size:
                raise SharedMemoryError(f"cannot map {size} bytes of an fd holding {file_size}: "
                                        "send the region's size with its fd")
            self._mmap = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            raise SharedMemoryError(f"cannot map shared memory fd {fd}: {exc}") from exc
        except SharedMemoryError:
            os.close(fd)
            raise
        self.fd = fd
        self.size_bytes = size
        anchor = ctypes.c_char.from_buffer(self._mmap)
        self.address = ctypes.addressof(anchor)  # virtual address of byte 0 in this process
        del anchor  # releases the buffer export again
        self.buffer = memoryview(self._mmap)  # [size_bytes], uint8, host

    @classmethod
    def create(cls, size_bytes: int, name: str = "disaggsdk-kv") -> SharedRegion:
        """Allocates a zero-filled region of size_bytes.

        Raises:
            SharedMemoryError: size is not positive or the kernel refuses (memory limits).
        """
        if size_bytes <= 0:
            raise SharedMemoryError(f"a shared region needs a positive size, got {size_bytes}")
        try:
            fd = os.memfd_create(name, os.MFD_CLOEXEC)
        except OSError as exc:
            raise SharedMemoryError(f"memfd_create failed: {exc}") from exc
        try:
            os.ftruncate(fd, size_bytes)
        except OSError as exc:
            os.close(fd)
            raise SharedMemoryError(f"cannot size a shared region to {size_bytes} bytes: "
                                    f"{exc}") from exc
        return cls(fd, size_bytes)

    @classmethod
    def from_fd(cls, fd: int, size_bytes: int | None = None) -> SharedRegion:
        """Maps a region received from another process (takes ownership of fd)."""
        return cls(fd, size_bytes)

    def as_tensor(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A CPU torch tensor over the whole region, sharing its memory (imports torch).

        Args:
            dtype: torch dtype of the elements; torch.uint8 when None.

        Returns:
            Tensor of shape [size_bytes // dtype itemsize].
        """
        import torch

        return torch.frombuffer(self._mmap, dtype=dtype or torch.uint8)

    def close(self) -> None:
        """Unmaps and closes the fd.

        Raises:
            SharedMemoryError: views are still exported (a tensor, or a transfer-engine
                registration): release or deregister them first.
        """
        if self.fd < 0:
            return
        in_use = SharedMemoryError("the shared region is still in use (a tensor view or a "
                                   "transfer-engine registration): drop or deregister it "
                                   "before close()")
        try:
            self.buffer.release()  # fails while views of self.buffer exist
        except BufferError as exc:
            raise in_use from exc
        try:
            self._mmap.close()  # fails while views of the mmap itself exist
        except BufferError as exc:
            self.buffer = memoryview(self._mmap)
            raise in_use from exc
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> SharedRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# the registry's twin (`disaggsdk.kv.pools.base.PoolTwin`)

def allocate_pool(size_bytes: int, device: int | None, name: str) -> SharedRegion:
    """A rank's pool in host memory: a memfd of ``size_bytes`` named ``name`` (``device`` is None)."""
    assert device is None, "host memory is on no CUDA device"
    return SharedRegion.create(size_bytes, name)


def map_pool(fd: int, size_bytes: int, device: int | None) -> SharedRegion:
    """A host pool another process sent as ``fd``, mapped here (takes ownership of fd)."""
    return SharedRegion.from_fd(fd, size_bytes)
