"""A unit's pools as the transport registers them: host pools as they are, GPU pools as device memory
where the provider can, else (or when asked) through host mirrors."""

from __future__ import annotations

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.launch.kv_pools import register_pools  # noqa: E402
from disaggsdk.memory.rank_pool import create_rank_pool  # noqa: E402
from disaggsdk.spec import Hardware, Spec  # noqa: E402
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=no_gpu("needs an NVIDIA GPU (and cuda-python)"))
def test_cuda_pools_are_device_memory_or_mirrored_and_read_as_the_host_twin():
    """On shm, CUDA pools are registered as device memory where this libfabric has CUDA IPC, else
    mirrored; either way the bytes the transport sees of a staged page equal the host twin's."""
    spec = Spec(model="qwen3-tiny")  # device cuda, transport auto
    pools = [create_rank_pool(SIZE, "cuda:0", "t0")]
    unit = register_pools(spec, "shm", pools, SIZE, LAYERS, PAGES, remote_write=True)
    try:
        assert unit.mode in ("device", "mirror"), unit.reason
        pools[0].as_tensor()[:SIZE].view(LAYERS, PAGES, PAGE_BYTES)[0, 2] = 9
        if unit.staging is not None:
            unit.staging.to_host(0, [2])
            seen = bytes(unit.registrations[0].view()[2 * PAGE_BYTES:][:PAGE_BYTES])
        else:
            seen = bytes(pools[0].as_tensor()[2 * PAGE_BYTES:3 * PAGE_BYTES].cpu().numpy())
        assert seen == b"\x09" * PAGE_BYTES
    finally:
        _close(unit)
