"""A page entry round-trips, and every kind of damage or mismatch is refused by name."""

from __future__ import annotations

import dataclasses
import struct

import pytest

from disaggsdk.kv.tiers.base import TierConfigError
from disaggsdk.kv.tiers.page_entry import (
    HEADER_ALIGN_BYTES,
    MIN_HEADER_BYTES,
    CorruptPageError,
    PageIdentity,
    decode_entry,
    encode_entry,
    entry_size,
)
from tests.kv.tiers.conftest import PAGE_BYTES, page


def test_an_entry_round_trips_and_its_data_is_aligned(identity):
    block_hash, data = page(1)
    raw = encode_entry(identity, block_hash, data)
    assert entry_size(raw) == len(raw)
    out = decode_entry(identity, block_hash, raw)
    assert bytes(out) == data
    assert (len(raw) - PAGE_BYTES) % HEADER_ALIGN_BYTES == 0  # the data starts aligned
    assert decode_entry(identity, block_hash, memoryview(raw)) == data


def test_keys_differ_by_every_identity_field(identity):
    block_hash, _ = page(1)
    key = identity.key(block_hash)
    assert key.startswith(block_hash.hex() + "-")
    others = [dataclasses.replace(identity, model="other"), dataclasses.replace(identity, layout="NHD"),
              dataclasses.replace(identity, dtype="fp8"), dataclasses.replace(identity, page_size=8),
              dataclasses.replace(identity, tp_rank=1, tp_size=2), dataclasses.replace(identity, tp_size=2),
              dataclasses.replace(identity, page_bytes=PAGE_BYTES + 1)]
    keys = {other.key(block_hash) for other in others}
    assert len(keys) == len(others) and key not in keys
    assert identity.key(page(2)[0]) != key


@pytest.mark.parametrize("field,value", [("model", "another-model"), ("layout", "NHD"), ("dtype", "fp8"),
                                         ("page_size", 8), ("tp_rank", 1), ("tp_size", 4),
                                         ("page_bytes", PAGE_BYTES + 1)])
def test_an_entry_of_another_identity_is_refused_naming_the_field(identity, field, value):
    identity = dataclasses.replace(identity, tp_size=8)
    block_hash, data = page(1)
    raw = encode_entry(identity, block_hash, data)
    reader = dataclasses.replace(identity, **{field: value})
    with pytest.raises(CorruptPageError, match=field) as info:
        decode_entry(reader, block_hash, raw)
    assert info.value.kind == "identity"


def _flip(raw: bytes, offset: int) -> bytes:
    damaged = bytearray(raw)
    damaged[offset] ^= 0x01
    return bytes(damaged)


def test_every_kind_of_damage_is_detected(identity):
    block_hash, data = page(1)
    raw = encode_entry(identity, block_hash, data)
    header_bytes = len(raw) - PAGE_BYTES
    cases = {
        "magic": _flip(raw, 0),
        "version": raw[:4] + struct.pack("<H", 99) + raw[6:],
        "length": raw[:-1],  # torn
        "digest": _flip(raw, header_bytes + 100),  # a bit of the data
    }
    for kind, damaged in cases.items():
        with pytest.raises(CorruptPageError) as info:
            decode_entry(identity, block_hash, damaged)
        assert info.value.kind == kind, kind
    with pytest.raises(CorruptPageError) as info:
        decode_entry(identity, page(2)[0], raw)  # another page's entry under this key
    assert info.value.kind == "block_hash"
    with pytest.raises(CorruptPageError) as info:
        decode_entry(identity, block_hash, raw[: MIN_HEADER_BYTES - 1])
    assert info.value.kind == "length"
    with pytest.raises(CorruptPageError) as info:
        decode_entry(identity, block_hash, raw + b"\0" * 10)  # padding not cut
    assert info.value.kind == "length"


def test_data_of_the_wrong_size_or_a_bad_identity_is_a_config_error(identity):
    block_hash, data = page(1)
    with pytest.raises(TierConfigError, match="page_bytes"):
        encode_entry(identity, block_hash, data[:-1])
    with pytest.raises(TierConfigError, match="block_hash"):
        encode_entry(identity, b"", data)
    with pytest.raises(TierConfigError, match="layout"):
        PageIdentity("m", "XYZ", "float32", 4, 0, 1, 10)
    with pytest.raises(TierConfigError, match="tp_rank"):
        PageIdentity("m", "HND", "float32", 4, 2, 2, 10)
    with pytest.raises(TierConfigError, match="page_bytes"):
        PageIdentity("m", "HND", "float32", 4, 0, 1, 0)
