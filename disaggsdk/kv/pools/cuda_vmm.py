"""Shareable GPU memory for the KV pool through the CUDA driver's virtual memory management: the
CUDA twin of a rank's pool (`disaggsdk.kv.pools.base.RankPool`; its host twin is `shared_memory`).

Owner rank: `CudaSharedAllocation.create` = cuMemCreate (POSIX-FD handle type) + map in this
process + cuMemExportToShareableHandle -> fd. The fd travels with `fd_passing.send_fd(...,
kind=KIND_CUDA)`. Head process: `CudaSharedMapping.import_fd` = cuMemImportFromShareableHandle +
cuMemAddressReserve + cuMemMap + cuMemSetAccess; the mapping's address is registered with the
transfer engine (`TransferEngine.register_pointer(..., cuda_device=...)`).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from disaggsdk.kv.pools.base import SharedMemoryError

if TYPE_CHECKING:
    import torch


class CudaDriverMissing(SharedMemoryError):
    """cuda-python or the NVIDIA driver is not available."""


def load_driver() -> Any:
    """Imports `cuda.bindings.driver` and initialises the driver.

    Raises:
        CudaDriverMissing: cuda-python is not installed or there is no CUDA driver.
    """
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise CudaDriverMissing("cuda-python is not installed: `pip install 'disaggsdk[gpu]'` "
                                f"({exc})") from exc
    except Exception as exc:  # DynamicLibNotFoundError: no libcuda.so on this machine
        raise _no_driver(exc) from exc
    try:
        # cuda-bindings 13 loads libcuda at the first call (DynamicLibNotFoundError without it), 12.9 too
        # ("RuntimeError: Failed to dlopen libcuda.so.1")
        result = driver.cuInit(0)
    except Exception as exc:  # whichever the binding raises, the driver is not there
        raise _no_driver(exc) from exc
    _check(driver, result, "cuInit")
    return driver


def _no_driver(exc: Exception) -> CudaDriverMissing:
    return CudaDriverMissing(f"no CUDA driver on this machine ({type(exc).__name__}: {exc}); "
                             "use host memory (SharedRegion) or run on a GPU node")


def _check(driver: Any, result: Any, call: str) -> Any:
    """Unpacks a cuda-python result tuple; raises SharedMemoryError on a CUDA error."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorString(err)
        text = name.decode() if isinstance(name, bytes) else str(name)
        raise SharedMemoryError(f"{call} failed: {text} ({int(err)})")
    return values[0] if len(values) == 1 else tuple(values) or None


def _granularity(driver: Any, prop: Any) -> int:
    """The smallest size and alignment cuMemCreate / cuMemMap accept for ``prop``."""
    return _check(driver, driver.cuMemGetAllocationGranularity(
        prop, driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity")


def _prop(driver: Any, device: int) -> Any:
    prop = driver.CUmemAllocationProp()
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = (
        driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return prop


def _use_device(driver: Any, device: int) -> Any:
    """Makes the device's primary context current (needed by cuMemMap in a fresh process)."""
    dev = _check(driver, driver.cuDeviceGet(device), "cuDeviceGet")
    ctx = _check(driver, driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    _check(driver, driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return dev


def _map(driver: Any, handle: Any, size_bytes: int, granularity: int, device: int) -> int:
    va = _check(driver, driver.cuMemAddressReserve(size_bytes, granularity, 0, 0),
                "cuMemAddressReserve")
    try:
        _check(driver, driver.cuMemMap(va, size_bytes, 0, handle, 0), "cuMemMap")
        access = driver.CUmemAccessDesc()
        access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        _check(driver, driver.cuMemSetAccess(va, size_bytes, [access], 1), "cuMemSetAccess")
    except SharedMemoryError:
        driver.cuMemUnmap(va, size_bytes)
        driver.cuMemAddressFree(va, size_bytes)
        raise
    return int(va)


class _CudaMapped:
    """A physical allocation handle mapped at `address` in this process."""

    def __init__(self, driver: Any, handle: Any, address: int, size_bytes: int, device: int):
        self._driver, self._handle = driver, handle
        self.address = address  # device virtual address of byte 0
        self.size_bytes = size_bytes
        self.device = device
        self.cuda_device: int | None = device  # the RankPool contract: device memory of this ordinal
        self.fd = -1

    def as_tensor(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A CUDA tensor over the whole mapping, sharing its memory (imports torch).

        The tensor keeps this object alive, but `close` unmaps the memory all the same: close it only
        once its tensors are no longer used.

        Args:
            dtype: element type; torch.uint8 when None.
        Returns:
            Tensor of shape [size_bytes // dtype itemsize] on ``cuda:<device>``.
        """
        from disaggsdk.kv.pools.cuda_array import cuda_bytes

        raw = cuda_bytes(self.address, self.size_bytes, owner=self, device=f"cuda:{self.device}")
        return raw if dtype is None else raw.view(dtype)

    def close(self) -> None:
        """Unmaps, frees the address range, releases the handle and closes the fd (if any)."""
        if self._handle is None:
            return
        d = self._driver
        d.cuMemUnmap(self.address, self.size_bytes)
        d.cuMemAddressFree(self.address, self.size_bytes)
        d.cuMemRelease(self._handle)
        self._handle = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> _CudaMapped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CudaSharedAllocation(_CudaMapped):
    """GPU memory created here, mapped here, and exported as a POSIX fd (`fd`)."""

    @classmethod
    def create(cls, size_bytes: int, device: int = 0) -> CudaSharedAllocation:
        """Allocates at least size_bytes (rounded up to the allocation granularity).

        Raises:
            CudaDriverMissing: no cuda-python or no driver.
            SharedMemoryError: a CUDA call failed (out of memory, VMM unsupported).
        """
        driver = load_driver()
        _use_device(driver, device)
        prop = _prop(driver, device)
        gran = _granularity(driver, prop)
        size = -(-size_bytes // gran) * gran
        handle = _check(driver, driver.cuMemCreate(size, prop, 0), "cuMemCreate")
        try:
            fd = _check(driver, driver.cuMemExportToShareableHandle(
                handle, driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0), "cuMemExportToShareableHandle")
            address = _map(driver, handle, size, gran, device)
        except SharedMemoryError:
            driver.cuMemRelease(handle)
            raise
        alloc = cls(driver, handle, address, size, device)
        alloc.fd = int(fd)
        return alloc


class CudaSharedMapping(_CudaMapped):
    """GPU memory of another process, imported from its fd and mapped here."""

    @classmethod
    def import_fd(cls, fd: int, size_bytes: int, device: int = 0) -> CudaSharedMapping:
        """Imports an exported allocation; takes ownership of fd (closed after import).

        Raises:
            CudaDriverMissing: no cuda-python or no driver.
            SharedMemoryError: a CUDA call failed (wrong size or device, bad fd).
        """
        try:
            driver = load_driver()
            _use_device(driver, device)
            prop = _prop(driver, device)
            gran = _granularity(driver, prop)
            handle = _check(driver, driver.cuMemImportFromShareableHandle(
                fd, driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
                "cuMemImportFromShareableHandle")
        finally:
            os.close(fd)  # the imported handle holds its own reference
        try:
            address = _map(driver, handle, size_bytes, gran, device)
        except SharedMemoryError:
            driver.cuMemRelease(handle)
            raise
        return cls(driver, handle, address, size_bytes, device)


# the registry's twin (`disaggsdk.kv.pools.base.PoolTwin`)

def allocate_pool(size_bytes: int, device: int | None, name: str) -> CudaSharedAllocation:
    """A rank's pool in GPU memory: cuMem of at least ``size_bytes`` on CUDA ordinal ``device``
    (``name`` is the host twin's: cuMem memory has none)."""
    assert device is not None, "a cuMem pool is on a CUDA device"
    return CudaSharedAllocation.create(size_bytes, device=device)


def map_pool(fd: int, size_bytes: int, device: int | None) -> CudaSharedMapping:
    """A cuMem pool another process exported as ``fd``, imported and mapped on ``device`` (takes
    ownership of fd)."""
    assert device is not None, "a cuMem pool is on a CUDA device"
    return CudaSharedMapping.import_fd(fd, size_bytes, device)
