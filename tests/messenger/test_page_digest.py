"""The page digest: prefill's (from the writes that fill each destination page, in any order) equals
decode's (from the pages it holds) exactly when every byte arrived as sent."""

from __future__ import annotations

import os
from array import array

import pytest

from disaggsdk.messenger.page_digest import PageDigest, add_granted_pages, add_layer, attempt_key
from disaggsdk.messenger.write_plan import PairWrites, PoolGeometry

SECRET = b"s" * 32
SRC = PoolGeometry(num_layers=2, num_pages=6, page_bytes=64)  # one prefill rank: half a decode page's heads
DST = PoolGeometry(num_layers=2, num_pages=8, page_bytes=128)
SRC_PAGES, DST_PAGES = [1, 4, 2], [6, 0, 3]


def reconstruct_writes(layer: int) -> list[PairWrites]:
    """Two prefill ranks each fill half of every decode page (a `reconstruct` route): rank r's
    page goes to bytes [64 r, 64 r + 64) of the decode page, listed in reverse to show order does
    not matter."""
    out = []
    for rank in (1, 0):
        src = array("Q", [SRC.page_offset(layer, p) for p in SRC_PAGES])
        dst = array("Q", [DST.page_offset(layer, p) + 64 * rank for p in DST_PAGES])
        out.append(PairWrites(rank, 0, src[::-1], dst[::-1], array("Q", [64] * len(src))))
    return out


def run(tamper=None):
    """Prefill's digest of the writes and decode's of the pages they filled (after ``tamper``)."""
    src_pools = [memoryview(bytearray(os.urandom(SRC.pool_bytes))) for _ in range(2)]
    dst_pool = bytearray(DST.pool_bytes)
    key = attempt_key(SECRET, "req-1", 3, 77)
    sent = PageDigest(key)
    for layer in (1, 0):  # the streamer may finish layers in any order
        pairs = reconstruct_writes(layer)
        add_layer(sent, layer, pairs, src_pools, DST, {p: i for i, p in enumerate(DST_PAGES)})
        for w in pairs:  # what the fabric does
            for s, d, n in zip(w.src_offsets, w.dst_offsets, w.lengths):
                dst_pool[d : d + n] = src_pools[w.src_tp_rank][s : s + n]
    if tamper:
        tamper(dst_pool)
    held = PageDigest(key)
    add_granted_pages(held, [memoryview(dst_pool)], DST, DST_PAGES)
    return sent.digest(), held


def test_the_digests_agree_when_every_byte_arrived():
    sent, held = run()
    assert held.matches(sent)


@pytest.mark.parametrize("where", [DST.page_offset(0, 6), DST.page_offset(1, 3) + 127])
def test_one_changed_byte_of_a_granted_page_is_caught(where):
    def flip(pool):
        pool[where] ^= 1

    sent, held = run(flip)
    assert not held.matches(sent)


def test_swapping_two_pages_is_caught():
    def swap(pool):
        a, b = DST.page_offset(0, 6), DST.page_offset(0, 0)
        pool[a : a + 128], pool[b : b + 128] = bytes(pool[b : b + 128]), bytes(pool[a : a + 128])

    sent, held = run(swap)
    assert not held.matches(sent)


def test_a_digest_is_bound_to_its_attempt():
    page = bytes(range(128))
    digests = []
    for key in (attempt_key(SECRET, "req-1", 3, 77), attempt_key(SECRET, "req-1", 4, 77),
                attempt_key(SECRET, "req-2", 3, 77), attempt_key(b"t" * 32, "req-1", 3, 77)):
        d = PageDigest(key)
        d.add(0, 0, 0, [page])
        digests.append(d.digest())
    assert len(set(digests)) == 4
