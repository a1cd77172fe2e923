"""A unit's pools as the transport registers them: host pools as they are, GPU pools as device memory
where the provider can, through host mirrors when asked (or, under ``auto``, where it cannot: on
a GPU, shm must register device memory, and the mirrored path is its own case)."""

from __future__ import annotations

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.kv.pools import create_rank_pool  # noqa: E402
from disaggsdk.launch.kv_registration import register_pools, register_rank_pool  # noqa: E402
from disaggsdk.spec import Hardware, Spec  # noqa: E402
from disaggsdk.transfer import TransferEngine, WriteBatch  # noqa: E402
from tests.declared_skips import no_gpu  # noqa: E402

LAYERS, PAGES, PAGE_BYTES = 2, 4, 4096
SIZE = LAYERS * PAGES * PAGE_BYTES
CPU_SPEC = Spec(model="qwen3-tiny", device="cpu", hardware=Hardware(gpu="cpu"))


def _close(unit):
    for r in unit.registrations:
        unit.transfer.deregister(r)
    unit.transfer.close()


def test_host_pools_are_registered_as_they_are():
    pools = [create_rank_pool(SIZE, "cpu", f"t{r}") for r in range(2)]
    unit = register_pools(CPU_SPEC, "shm", pools, SIZE, LAYERS, PAGES, remote_write=True)
    try:
        assert (unit.mode, unit.staging, unit.mirrors) == ("host", None, [])
        assert [r.descriptor.length_bytes for r in unit.registrations] == [SIZE, SIZE]
    finally:
        _close(unit)


def test_host_staging_registers_mirrors_and_copies_into_them():
    spec = attrs.evolve(CPU_SPEC, transport=attrs.evolve(CPU_SPEC.transport, kv_staging="host"))
    pools = [create_rank_pool(SIZE, "cpu", "t0")]
    unit = register_pools(spec, "shm", pools, SIZE, LAYERS, PAGES, remote_write=False)
    try:
        assert unit.mode == "mirror" and "kv_staging is host" in unit.reason
        assert unit.staging is not None and len(unit.mirrors) == 1
        engine = pools[0].as_tensor().view(LAYERS, PAGES, PAGE_BYTES)
        engine[1, 3] = 7
        unit.staging.to_host(1, [3])
        assert bytes(unit.registrations[0].view()[(1 * PAGES + 3) * PAGE_BYTES:][:PAGE_BYTES]) == b"\x07" * PAGE_BYTES
    finally:
        _close(unit)


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=no_gpu("needs an NVIDIA GPU (and cuda-python)"))


@pytest.mark.gpu
@needs_gpu
def test_cuda_pools_are_registered_as_device_memory_and_take_writes_there():
    """On shm with ``kv_staging: auto``, a CUDA pool is registered as device memory (FI_HMEM for
    CUDA: shm's CUDA IPC), and a write through the transport lands in GPU memory. A libfabric built
    without CUDA support fails here, saying so: the host mirror is its own case below, never this
    one's way out."""
    spec = Spec(model="qwen3-tiny")  # device cuda, transport auto
    pools = [create_rank_pool(SIZE, "cuda:0", "t0")]
    unit = register_pools(spec, "shm", pools, SIZE, LAYERS, PAGES, remote_write=True)
    source = TransferEngine("shm")
    try:
        assert unit.mode == "device", f"this libfabric's shm cannot register CUDA memory (no FI_HMEM for CUDA): {unit.reason}"
        assert (unit.staging, unit.mirrors) == (None, [])
        assert unit.registrations[0].cuda_device == 0
        host = create_rank_pool(SIZE, "cpu", "source")
        host.as_tensor().view(LAYERS, PAGES, PAGE_BYTES)[1, 3] = 9
        src = register_rank_pool(source, host, SIZE, remote_write=False)
        landed = unit.transfer.expect(imm=7, count=1)
        page = 1 * PAGES + 3  # layer 1's page 3: the pool's flat page index
        batch = WriteBatch.pages(src, unit.registrations[0].descriptor, [page], [page], PAGE_BYTES, imm=7)
        source.submit(source.add_peer(unit.transfer.address), batch).result(timeout=30)
        landed.result(timeout=30)
        device_pages = pools[0].as_tensor()[:SIZE].view(LAYERS, PAGES, PAGE_BYTES)
        assert bytes(device_pages[1, 3].cpu().numpy()) == b"\x09" * PAGE_BYTES
        assert int(device_pages[1, 2].count_nonzero()) == 0  # and nowhere else
        source.deregister(src)
    finally:
        source.close()
        _close(unit)


@pytest.mark.gpu
@needs_gpu
def test_cuda_pools_staged_through_host_mirrors_read_as_the_host_twin():
    """With ``kv_staging: host``, each CUDA pool gets a registered host mirror: a page staged out
    reads in the mirror as it is on the device, and a page staged in lands on the device."""
    spec = Spec(model="qwen3-tiny")
    spec = attrs.evolve(spec, transport=attrs.evolve(spec.transport, kv_staging="host"))
    pools = [create_rank_pool(SIZE, "cuda:0", "t0")]
    unit = register_pools(spec, "shm", pools, SIZE, LAYERS, PAGES, remote_write=True)
    try:
        assert unit.mode == "mirror" and unit.staging is not None, unit.reason
        device_pages = pools[0].as_tensor()[:SIZE].view(LAYERS, PAGES, PAGE_BYTES)
        device_pages[0, 2] = 9
        unit.staging.to_host(0, [2])
        assert bytes(unit.registrations[0].view()[2 * PAGE_BYTES:][:PAGE_BYTES]) == b"\x09" * PAGE_BYTES
        unit.mirrors[0].as_tensor().view(LAYERS, PAGES, PAGE_BYTES)[:, 1] = 5
        unit.staging.to_device([1])
        assert bytes(device_pages[:, 1].cpu().numpy().tobytes()) == b"\x05" * (LAYERS * PAGE_BYTES)
    finally:
        _close(unit)
