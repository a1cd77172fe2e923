"""Paged writes between real processes land byte for byte, on shm and tcp;ofi_rxm."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.transfer.conftest import DST_BYTES

_imms = itertools.count(1_000_000)


@st.composite
def page_maps(draw):
    """(page_bytes, src_pages, dst_pages): dst pages distinct, some runs contiguous."""
    page_bytes = draw(st.sampled_from([64, 1024, 4096, 16384]))
    num_pages = DST_BYTES // page_bytes
    n = draw(st.integers(1, min(48, num_pages)))
    dst = draw(st.lists(st.integers(0, num_pages - 1), min_size=n, max_size=n, unique=True))
    if draw(st.booleans()):  # contiguous on both sides: exercises coalescing
        start_src, start_dst = draw(st.integers(0, num_pages - n)), draw(st.integers(0, num_pages - n))
        return page_bytes, list(range(start_src, start_src + n)), list(range(start_dst, start_dst + n))
    src = draw(st.lists(st.integers(0, num_pages - 1), min_size=n, max_size=n))
    return page_bytes, src, dst


def _write_and_check(target, sender_idx, page_bytes, src_pages, dst_pages):
    sender = target.senders[sender_idx]
    imm = next(_imms)
    target.pool.buffer[:] = bytes(DST_BYTES)
    counted = target.engine.expect(imm, len(src_pages))
    reply = sender.call("write", [p * page_bytes for p in src_pages],
                        [p * page_bytes for p in dst_pages], page_bytes, imm)
    assert reply[0] == "ok", reply
    counted.result(timeout=30)  # every entry counted, merged or not
    dst, src = target.pool.buffer, sender.src.buffer
    for s, d in zip(src_pages, dst_pages):
        assert dst[d * page_bytes:(d + 1) * page_bytes] == src[s * page_bytes:(s + 1) * page_bytes]
    written = set(dst_pages)
    untouched = [p for p in range(DST_BYTES // page_bytes) if p not in written][:64]
    for p in untouched:  # nothing lands outside the map
        assert dst[p * page_bytes:(p + 1) * page_bytes] == bytes(page_bytes)
    return reply[1]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(page_maps(), st.integers(0, 1))
def test_random_page_maps_land_byte_for_byte(target, page_map, sender_idx):
    _write_and_check(target, sender_idx, *page_map)


def test_contiguous_pages_are_coalesced(target):
    # a tiny write just to read the sender's counters; wait until it landed (shm completes
    # small writes locally before the target has applied them) so it cannot hit the map below
    imm = next(_imms)
    landed = target.engine.expect(imm, 1)
    before = target.senders[0].call("write", [0], [0], 8, imm)[1]
    landed.result(timeout=30)
    stats = _write_and_check(target, 0, 8192, list(range(64)), list(range(32, 96)))
    assert stats["writes_requested"] - before["writes_requested"] == 64
    assert stats["writes_posted"] - before["writes_posted"] == 1  # one write for 64 pages
    # the direct path copied all 64 itself and sent one zero-length write with the count of 64
    assert stats["writes_direct"] - before["writes_direct"] == (64 if target.direct else 0)
