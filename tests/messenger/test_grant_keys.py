"""Per-grant keys: the runs a grant opens, and how prefill's writes are split into them."""

from __future__ import annotations

from array import array

import pytest

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.grant_keys import GrantTargets, page_runs
from disaggsdk.messenger.write_plan import PoolGeometry
from disaggsdk.transfer.descriptors import RegionDescriptor

GEOMETRY = PoolGeometry(num_layers=2, num_pages=10, page_bytes=100)


def test_page_runs_merge_consecutive_pages_in_every_layer():
    # pages 3, 4, 5 are one run, 8 another; layer 1 starts 1,000 bytes in
    assert page_runs(GEOMETRY, [8, 3, 5, 4]) == [(300, 300), (800, 100), (1300, 300), (1800, 100)]
    assert page_runs(GEOMETRY, []) == []


@pytest.mark.parametrize("addr_base", [0, 1 << 40], ids=["offsets", "virtual-addresses"])
def test_writes_are_split_by_segment_with_offsets_relative_to_it(addr_base):
    pool = RegionDescriptor(addr_base, key=1, length_bytes=GEOMETRY.pool_bytes, mr_mode=0, check=0)
    segments = [pr.GrantSegment(1300, 300, key=77, check=5), pr.GrantSegment(300, 300, key=66, check=4)]
    targets = GrantTargets(pool, segments)
    dst = array("Q", [300, 450, 1300, 1500])
    src = array("Q", [0, 1, 2, 3])
    lengths = array("Q", [100, 50, 100, 100])
    split = {d.key: (d, list(o), [list(c) for c in cols]) for d, o, cols in targets.split(dst, src, lengths)}
    assert sorted(split) == [66, 77]
    first, offsets, (srcs, lens) = split[66]
    assert offsets == [0, 150] and srcs == [0, 1] and lens == [100, 50]
    assert (first.addr_base, first.length_bytes, first.check) == ((addr_base + 300) if addr_base else 0, 300, 4)
    second, offsets, (srcs, _) = split[77]
    assert offsets == [0, 200] and srcs == [2, 3]


def test_a_write_outside_every_segment_is_refused_whole():
    pool = RegionDescriptor(0, 1, GEOMETRY.pool_bytes, 0, 0)
    targets = GrantTargets(pool, [pr.GrantSegment(300, 300, 9, 0)])
    for dst in ([200], [550]):  # before the run; inside it but running past its end
        with pytest.raises(ValueError, match="outside every granted segment"):
            list(targets.split(array("Q", dst), array("Q", [0]), array("Q", [100])))


@pytest.mark.parametrize("segments", [
    [pr.GrantSegment(1900, 200, 1, 0)],  # past the pool's end
    [pr.GrantSegment(300, 300, 1, 0), pr.GrantSegment(500, 100, 2, 0)],  # overlapping
    [pr.GrantSegment(300, 0, 1, 0)],  # empty
])
def test_segments_outside_the_pool_or_overlapping_are_refused(segments):
    with pytest.raises(ValueError, match="outside"):
        GrantTargets(RegionDescriptor(0, 1, GEOMETRY.pool_bytes, 0, 0), segments)


def test_a_grant_on_device_memory_registers_device_memory():
    """A key over part of a GPU pool is registered as that device's memory; the context slot stays host."""
    from disaggsdk.messenger.grant_keys import open_grant
    from disaggsdk.transfer.descriptors import MemoryRegion

    asked: list[tuple[int, int, int | None]] = []

    class Recording:
        def register_pointer(self, address, length_bytes, *, cuda_device=None):
            asked.append((address, length_bytes, cuda_device))
            descriptor = RegionDescriptor(address, len(asked), length_bytes, 0, 0)
            return MemoryRegion(len(asked), address, length_bytes, descriptor, None, cuda_device=cuda_device)

        def deregister(self, region):
            pass

    pool = MemoryRegion(1, 1 << 20, GEOMETRY.pool_bytes, RegionDescriptor(1 << 20, 1, GEOMETRY.pool_bytes, 0, 0), None,
                        cuda_device=3)
    context = MemoryRegion(2, 1 << 30, 400, RegionDescriptor(1 << 30, 2, 400, 0, 0), None)
    open_grant(Recording(), [pool], GEOMETRY, [4, 5], context, 100, 100)
    *pages, slot = asked
    assert pages and all(device == 3 for _, _, device in pages)
    assert slot == ((1 << 30) + 100, 100, None)
