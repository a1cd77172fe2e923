"""The cuMem path: export in one process, import and map in another (GPU only)."""

from __future__ import annotations

import multiprocessing
import socket

import pytest

from disaggsdk.kv.pools.cuda_vmm import CudaDriverMissing, load_driver
from disaggsdk.kv.pools.fd_passing import KIND_CUDA, recv_fd, send_fd
from tests.declared_skips import gpu_present, no_gpu


def _cuda_available() -> bool:
    try:
        driver = load_driver()
    except CudaDriverMissing:
        return False
    err, count = driver.cuDeviceGetCount()
    return err == driver.CUresult.CUDA_SUCCESS and count > 0


def test_without_driver_the_error_says_what_to_do():
    if _cuda_available():
        pytest.skip(gpu_present("checks what a machine without a CUDA driver says"))
    with pytest.raises(CudaDriverMissing, match="disaggsdk\\[gpu\\]|no CUDA driver"):
        load_driver()


def _head_imports(sock: socket.socket) -> None:
    from disaggsdk.kv.pools.cuda_vmm import CudaSharedMapping

    fd, size, kind, device = recv_fd(sock)
    assert kind == KIND_CUDA
    with CudaSharedMapping.import_fd(fd, size, device) as mapping:
        d = load_driver()
        d.cuMemsetD8(mapping.address, 0x5A, size)
        d.cuCtxSynchronize()
        sock.send(b"k")
        sock.recv(1)


@pytest.mark.gpu
def test_export_import_across_processes():
    if not _cuda_available():
        pytest.skip(no_gpu("needs an NVIDIA GPU (and cuda-python)"))
    from disaggsdk.kv.pools.cuda_vmm import CudaSharedAllocation

    ctx = multiprocessing.get_context("spawn")
    a, b = socket.socketpair()
    proc = ctx.Process(target=_head_imports, args=(b,), daemon=True)
    try:
        with CudaSharedAllocation.create(3 << 20, device=0) as alloc:
            proc.start()
            b.close()
            send_fd(a, alloc.fd, alloc.size_bytes, KIND_CUDA, alloc.device)
            a.settimeout(120)
            assert a.recv(1) == b"k"
            d = load_driver()
            host = bytearray(alloc.size_bytes)
            err, = d.cuMemcpyDtoH(host, alloc.address, alloc.size_bytes)
            assert err == d.CUresult.CUDA_SUCCESS
            assert host == b"\x5a" * alloc.size_bytes
            a.send(b"q")
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        a.close()
        b.close()


@pytest.mark.gpu
def test_register_device_memory_with_the_transfer_engine():
    if not _cuda_available():
        pytest.skip(no_gpu("needs an NVIDIA GPU (and cuda-python)"))
    from disaggsdk.kv.pools.cuda_vmm import CudaSharedAllocation
    from disaggsdk.transfer import TransferEngine, TransferError

    with CudaSharedAllocation.create(2 << 20) as alloc:
        try:
            engine = TransferEngine("shm", hmem=True)
        except TransferError as exc:
            pytest.skip(f"this libfabric's shm has no FI_HMEM: {exc}")
        with engine:
            region = engine.register_pointer(alloc.address, alloc.size_bytes, cuda_device=0)
            assert region.descriptor.length_bytes == alloc.size_bytes
            engine.deregister(region)
