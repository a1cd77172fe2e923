"""Same-host descriptors: what a peer needs to map a region, and every way that can be refused."""

from __future__ import annotations

import os
import subprocess
import sys

import attrs
import pytest

from disaggsdk.kv.pools.shared_memory import SharedRegion
from disaggsdk.transfer.descriptors import RegionDescriptor
from disaggsdk.transfer.errors import TransferError
from disaggsdk.transfer.same_host import PeerMapping, SameHostShare, host_id


def test_a_share_round_trips_and_a_flipped_byte_is_refused():
    with SharedRegion.create(1 << 16, "share-test") as region:
        share = SameHostShare.of_fd(region.fd, 4096)
        desc = RegionDescriptor(1 << 40, 7, 1 << 12, 16, 99, same_host=share)
        data = desc.to_bytes()
        assert len(data) == RegionDescriptor.wire_bytes()
        assert RegionDescriptor.from_bytes(data) == desc
        assert RegionDescriptor.from_bytes(attrs.evolve(desc, same_host=None).to_bytes()).same_host is None
        bad = bytearray(data)
        bad[-20] ^= 1  # the offset field: a wrong offset would write the wrong pages
        with pytest.raises(TransferError, match="same-host block fails its check"):
            RegionDescriptor.from_bytes(bytes(bad))


def test_a_mapping_sees_and_writes_the_same_bytes():
    with SharedRegion.create(1 << 16, "share-test") as region:
        region.buffer[4096:4100] = b"kvkv"
        mapping = PeerMapping(SameHostShare.of_fd(region.fd, 4096), 8192)
        try:
            import ctypes

            assert ctypes.string_at(mapping.address, 4) == b"kvkv"
            ctypes.memmove(mapping.address + 8, b"page", 4)
            assert bytes(region.buffer[4104:4108]) == b"page"
        finally:
            mapping.close()


def test_mappings_are_refused_for_another_file_host_or_size():
    with SharedRegion.create(1 << 16, "share-test") as region, SharedRegion.create(1 << 16, "other") as other:
        share = SameHostShare.of_fd(region.fd)
        with pytest.raises(TransferError, match="no longer the region's"):
            PeerMapping(attrs.evolve(share, fd=other.fd), 1 << 16)  # same process, another memfd
        with pytest.raises(TransferError, match="another machine"):
            PeerMapping(attrs.evolve(share, host=bytes(16)), 1 << 16)
        with pytest.raises(TransferError, match="holds 65536 bytes"):
            PeerMapping(share, 1 << 20)
        with pytest.raises(TransferError, match="cannot open"):
            PeerMapping(attrs.evolve(share, pid=2 ** 22 + 17), 1 << 16)  # no such process


def test_host_id_names_this_boot_and_namespaces():
    """Another process in the same namespaces is on the same host; other namespaces are not
    (tests/testbed/test_deployment_across_nodes.py runs it in two testbed nodes)."""
    assert len(host_id()) == 16 and any(host_id())
    script = "from disaggsdk.transfer.same_host import host_id; print(host_id().hex())"
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert child.stdout.strip() == host_id().hex()
    with open("/proc/sys/kernel/random/boot_id") as f:  # more than the kernel's boot id
        assert host_id() != bytes.fromhex(f.read().strip().replace("-", ""))
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        assert SameHostShare.of_fd(fd).pid == os.getpid()
    finally:
        os.close(fd)


@pytest.mark.parametrize("reachable", [True, False])
def test_direct_writes_count_like_fabric_writes_and_fall_back_when_unmappable(reachable):
    """Two shm endpoints in this process: the direct path, or libfabric when the map fails."""
    pytest.importorskip("disaggsdk.transfer._fabric")
    from disaggsdk.transfer import TransferEngine, WriteBatch

    page = 4096
    with TransferEngine("shm") as target, TransferEngine("shm") as initiator, \
            SharedRegion.create(64 * page, "direct-dst") as dst, SharedRegion.create(64 * page, "direct-src") as src:
        src.buffer[:] = os.urandom(64 * page)
        dst_region = target.register(dst.buffer, shared_fd=dst.fd)
        src_region = initiator.register(src.buffer)
        desc = dst_region.descriptor
        if not reachable:  # a process that does not exist: the initiator cannot map the pool
            desc = attrs.evolve(desc, same_host=attrs.evolve(desc.same_host, pid=2 ** 22 + 17))
        peer = initiator.add_peer(target.address)
        src_pages, dst_pages = [3, 4, 5, 9, 0], [10, 11, 12, 40, 63]
        landed = target.expect(77, len(src_pages))
        initiator.submit(peer, WriteBatch.pages(src_region, desc, src_pages, dst_pages, page, 77)).result(timeout=30)
        landed.result(timeout=30)  # exactly five entries counted: the signal carries the count
        for s, d in zip(src_pages, dst_pages):
            assert dst.buffer[d * page:(d + 1) * page] == src.buffer[s * page:(s + 1) * page]
        stats = initiator.stats()
        assert stats["writes_direct"] == (5 if reachable else 0)
        assert bool(initiator.direct_failures) is not reachable
        assert target.stats()["imm_late"] == 0
        initiator.deregister(src_region)
        target.deregister(dst_region)
