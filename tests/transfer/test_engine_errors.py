"""Bad requests give typed exceptions and never crash: bounds, descriptors, peers, sizes."""

from __future__ import annotations

import subprocess
import sys

import attrs
import pytest

from disaggsdk.transfer import RegionDescriptor, TransferError, WriteBatch

PAGE = 4096


def test_out_of_bounds_is_refused_before_sending(target):
    reply = target.senders[0].call("write", [0], [(1 << 20) - PAGE // 2], PAGE, 1)
    assert reply[0] == "error" and "outside the destination region" in reply[1]
    reply = target.senders[0].call("write", [1 << 20], [0], PAGE, 1)
    assert reply[0] == "error" and "outside the source region" in reply[1]


def test_wrong_key_is_refused(target):
    desc = attrs.evolve(target.region.descriptor, key=target.region.descriptor.key + 7)
    src_region = target.engine.register(bytearray(PAGE))
    try:
        with pytest.raises(TransferError, match="fails its check"):
            target.engine.submit(target.peers[0], WriteBatch.pages(src_region, desc, [0], [0], PAGE, 1))
    finally:
        target.engine.deregister(src_region)


def test_descriptor_of_another_provider_is_refused(target):
    from disaggsdk.transfer import TransferEngine

    other = "tcp" if target.provider == "shm" else "shm"
    with TransferEngine(other) as eng:
        src_region = eng.register(bytearray(PAGE))
        peer = eng.add_peer(eng.address)
        with pytest.raises(TransferError, match="another provider"):
            eng.submit(peer, WriteBatch.pages(src_region, target.region.descriptor, [0], [0], PAGE, 1))
        eng.deregister(src_region)


def test_descriptor_bytes_round_trip_and_garbage():
    d = RegionDescriptor(1 << 40, 5, 1 << 20, 16, 123)
    assert RegionDescriptor.from_bytes(d.to_bytes()) == d
    with pytest.raises(TransferError, match="112 bytes"):
        RegionDescriptor.from_bytes(d.to_bytes()[:-1])
    with pytest.raises(TransferError, match="magic"):
        RegionDescriptor.from_bytes(b"X" + d.to_bytes()[1:])


def test_unknown_peer_and_closed_engine(target):
    from disaggsdk.transfer import Peer, TransferEngine

    eng = TransferEngine(target.provider)
    src_region = eng.register(bytearray(PAGE))
    with pytest.raises(TransferError, match="unknown peer"):
        eng.submit(Peer(987654, b""), WriteBatch.pages(src_region, target.region.descriptor, [0], [0], PAGE, 1))
    eng.deregister(src_region)
    eng.close()
    with pytest.raises(TransferError, match="closed"):
        eng.expect(1, 1)


def test_immediates_must_fit_32_bits(target):
    with pytest.raises(TransferError, match="32-bit"):
        WriteBatch.of(target.region, target.region.descriptor, [0], [0], PAGE, 1 << 32)


def test_missing_native_library_gives_the_package_name():
    # A fresh interpreter where the compiled module cannot be imported, as on a machine built
    # without libfabric: importing disaggsdk works, first use of the transport names the fix.
    code = (
        "import sys; sys.modules['disaggsdk.transfer._fabric'] = None\n"
        "import disaggsdk, disaggsdk.transfer\n"
        "from disaggsdk.transfer import TransferEngine, NativeLibraryMissing\n"
        "try:\n    TransferEngine('shm')\nexcept NativeLibraryMissing as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ERR" in out.stdout and "libfabric-dev" in out.stdout


def test_import_disaggsdk_does_not_load_native_code():
    code = ("import sys, disaggsdk, disaggsdk.transfer, disaggsdk.kv.pools.shared_memory\n"
            "bad = [m for m in ('torch', 'cffi', 'disaggsdk.transfer._fabric') if m in sys.modules]\n"
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
