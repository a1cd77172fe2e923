"""The decode side with per-grant keys and page verification (fake transport and engine): only the
granted pages are opened and only until the attempt ends; pages that do not match prefill's digest
are never admitted."""

from __future__ import annotations

import ctypes
import os
import time
from types import SimpleNamespace

import pytest

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.context import context_bytes, pack_context
from disaggsdk.messenger.decode_side import DecodeMessenger
from disaggsdk.messenger.grant_keys import page_runs
from disaggsdk.messenger.handoff import DRAIN_GRACE_S
from disaggsdk.messenger.page_digest import PageDigest, add_granted_pages, attempt_key
from disaggsdk.messenger.write_plan import PoolGeometry
from disaggsdk.plan import make_plan
from tests.messenger.test_decode_side import (
    HIDDEN,
    NUM_PAGES,
    PAGE_SIZE,
    SECRET,
    VOCAB,
    FakeEngine,
    FakeTransfer,
    from_prefill,
    last,
    unit,
)
from tests.plan.helpers import make_spec

NUM_LAYERS, PAGE_BYTES = 4, 64
GEOMETRY = PoolGeometry(NUM_LAYERS, NUM_PAGES, PAGE_BYTES)


class Region:
    """A registered host buffer as the messenger sees it (address, length, bytes)."""

    def __init__(self, size: int):
        self.buffer = bytearray(size)
        self.address = ctypes.addressof((ctypes.c_char * size).from_buffer(self.buffer))
        self.length_bytes = size
        self.cuda_device = None  # host memory

    def view(self) -> memoryview:
        return memoryview(self.buffer)


class KeyedTransfer(FakeTransfer):
    """Records which byte ranges are open to peers' writes."""

    def __init__(self):
        super().__init__()
        self.open: dict[int, tuple[int, int]] = {}  # key -> (address, length)
        self._keys = iter(range(1000, 10**6))

    def register_pointer(self, address: int, length_bytes: int, *, cuda_device=None):
        key = next(self._keys)
        self.open[key] = (address, length_bytes)
        return SimpleNamespace(key=key, descriptor=SimpleNamespace(length_bytes=length_bytes, key=key, check=key * 3))

    def deregister(self, region) -> None:
        del self.open[region.key]


@pytest.fixture
def side():
    plan = make_plan(make_spec(1, 1, model="qwen3-coder-tiny", p_replicas=2, page_size=PAGE_SIZE, dtype="float32"))
    engine, transfer = FakeEngine(), KeyedTransfer()
    engine.kv.cache.fmt = SimpleNamespace(num_layers=NUM_LAYERS, num_pages=NUM_PAGES, page_bytes=PAGE_BYTES)
    pool = Region(GEOMETRY.pool_bytes)
    context = Region(4 * context_bytes(HIDDEN, VOCAB))
    dm = DecodeMessenger(unit("decode-0", "decode"), engine, transfer, plan, context.view(), SECRET, deadline_s=5.0,
                         pools=[pool], context_region=context, grant_keys=True, verify_pages=True)
    for name in ("prefill-0", "prefill-1"):
        dm.add_prefill(unit(name, "prefill"))
    return dm, engine, transfer, pool, context


def land(req: pr.PrefillRequest, pool: Region, context: Region) -> bytes:
    """What prefill's writes do: random KV into the granted pages, a context into the slot; returns
    the digest prefill computed of them."""
    for layer in range(NUM_LAYERS):
        for page in req.destinations[0].page_ids:
            start = GEOMETRY.page_offset(layer, page)
            pool.buffer[start : start + PAGE_BYTES] = os.urandom(PAGE_BYTES)
    c = req.context
    pack_context(context.view()[c.offset_bytes : c.offset_bytes + c.length_bytes], [0.5] * HIDDEN, [0.0] * VOCAB,
                 time.monotonic())
    digest = PageDigest(attempt_key(SECRET, req.request_id, req.generation, req.imm))
    add_granted_pages(digest, [pool.view()], GEOMETRY, req.destinations[0].page_ids)
    digest.add_context(context.view()[c.offset_bytes : c.offset_bytes + c.length_bytes])
    return digest.digest()


def test_only_the_granted_pages_and_slot_are_open_and_only_until_the_counter_fires(side):
    dm, engine, transfer, pool, context = side
    dm.submit("r", list(range(13)), None)  # 12 tokens move: 3 pages
    _, req = last(transfer, pr.PrefillRequest)
    pages = req.destinations[0].page_ids
    in_pool = [(a - pool.address, n) for a, n in transfer.open.values() if a < context.address]
    # runs of consecutive pages are one registration each: the open bytes are exactly the granted ones
    opened = sorted(in_pool)
    open_bytes = {b for o, n in opened for b in range(o, o + n)}
    granted = {b for layer in range(NUM_LAYERS) for p in pages
               for b in range(GEOMETRY.page_offset(layer, p), GEOMETRY.page_offset(layer, p) + PAGE_BYTES)}
    assert open_bytes == granted and len(opened) == len(page_runs(GEOMETRY, pages))
    assert dm.open_grant_keys == len(transfer.open) == len(opened) + 1  # the runs and the context slot
    assert [(s.offset_bytes, s.length_bytes) for s in req.destinations[0].segments] == opened
    assert (req.context.segment.offset_bytes, req.context.segment.length_bytes) == (req.context.offset_bytes,
                                                                                      req.context.length_bytes)
    digest = land(req, pool, context)
    transfer.counters[req.imm][1].set_result(None)
    dm.poll()
    assert not transfer.open and engine.admitted == []  # revoked at once; admitted only with the digest
    assert dm.open_grant_keys == 0
    dm.on_frame(from_prefill(pr.PageDigest("r", req.generation, digest)))
    dm.poll()
    assert engine.admitted == ["r"] and dm.totals.counters.kv_pages_failed_verification == 0


def test_an_ended_attempts_keys_stay_until_no_write_of_it_can_land(side):
    dm, engine, transfer, pool, context = side
    dm.submit("r", list(range(9)), None)
    _, first = last(transfer, pr.PrefillRequest)
    first_keys = {s.key for s in first.destinations[0].segments} | {first.context.segment.key}
    dm.poll(time.monotonic() + 6)  # deadline: retried on prefill-1, the old attempt quarantined
    # its writes may still be coming: they land in its own parked pages, which keep their keys
    assert first_keys <= set(transfer.open)
    assert dm.open_grant_keys == len(transfer.open)  # the quarantined attempt's and the retry's
    dm.on_frame(from_prefill(pr.PrefillFailed("r", first.generation, "aborted")))
    dm.poll(time.monotonic() + DRAIN_GRACE_S + 0.01)
    assert not first_keys & set(transfer.open)  # drained: revoked with the pages' release
    assert dm.open_grant_keys == len(transfer.open)  # only the retry's


def test_pages_that_do_not_match_the_digest_are_retried_and_counted(side):
    dm, engine, transfer, pool, context = side
    dm.submit("r", list(range(9)), None)
    _, first = last(transfer, pr.PrefillRequest)
    digest = land(first, pool, context)
    pool.buffer[GEOMETRY.page_offset(2, first.destinations[0].page_ids[1]) + 5] ^= 0x40  # a forged write
    transfer.counters[first.imm][1].set_result(None)
    dm.on_frame(from_prefill(pr.PageDigest("r", first.generation, digest)))
    dm.poll()
    assert engine.admitted == [] and dm.totals.counters.kv_pages_failed_verification == 1
    assert dm.totals.counters.requests_retried == 1
    peer, second = last(transfer, pr.PrefillRequest)
    assert peer == "prefill-1" and second.generation != first.generation
    transfer.counters[second.imm][1].set_result(None)
    dm.on_frame(from_prefill(pr.PageDigest("r", second.generation, land(second, pool, context))))
    dm.poll()
    assert engine.admitted == ["r"]


def test_a_digest_for_another_attempt_is_stale(side):
    dm, engine, transfer, pool, context = side
    dm.submit("r", list(range(9)), None)
    _, req = last(transfer, pr.PrefillRequest)
    dm.on_frame(from_prefill(pr.PageDigest("r", req.generation + 1, b"\0" * 16)))
    dm.on_frame(from_prefill(pr.PageDigest("nobody", 1, b"\0" * 16)))
    assert dm.frames.by_reason.get("stale") == 2
