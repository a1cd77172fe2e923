"""Both sides of moving a decoding request (`KVMigrations`) against a fake transport and engines over
real page allocators: one write per page per layer per rank, counted; the source frees only once the
target admitted; every way a move can end leaves the request in exactly one place and frees the other
side's pages only when no write can land."""

from __future__ import annotations

import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from disaggsdk.engine.request_migration import MigrationError, RunningRequestState
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.freshness import FrameCodec
from disaggsdk.messenger.handoff import DEAD_PEER_GRACE_S, DRAIN_GRACE_S
from disaggsdk.messenger.kv_migration import KVMigrations
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.messenger.stats import TransferTotals
from disaggsdk.spec import load_spec
from disaggsdk.transfer.descriptors import RegionDescriptor
from tests.messenger._engine_pages import EnginePages

SECRET = b"kv-migration-test-secret-0123456"
NUM_PAGES, PAGE_SIZE, LAYERS, PAGE_BYTES = 32, 4, 3, 64
SPEC = load_spec("specs/tiny_pd.yaml")


class FakeEngine(EnginePages):
    """The engine's move contract over a real allocator: a suspended request keeps its pages."""

    def __init__(self, page_bytes: int = PAGE_BYTES):
        super().__init__(NUM_PAGES, PAGE_SIZE)
        self.config = SimpleNamespace(page_size=PAGE_SIZE)
        self.cache = SimpleNamespace(fmt=SimpleNamespace(num_layers=LAYERS, num_pages=NUM_PAGES,
                                                         page_bytes=page_bytes))
        self.running: dict[str, RunningRequestState] = {}
        self.suspended: dict[str, RunningRequestState] = {}

    def start(self, rid: str, computed: int) -> None:
        self.allocator.allocate(rid, -(-computed // PAGE_SIZE))
        self.running[rid] = RunningRequestState(rid, list(range(1, computed)), [7, 8], SamplingParams(),
                                                num_computed_tokens=computed)

    def suspend(self, rid):
        if rid not in self.running:
            raise MigrationError(f"request {rid!r} is not running on this engine")
        self.suspended[rid] = state = self.running.pop(rid)
        return state

    def resume(self, rid):
        self.running[rid] = self.suspended.pop(rid)
        return True

    def release_suspended(self, rid):
        del self.suspended[rid]
        return self.allocator.free(rid)

    def page_ids(self, rid):
        return self.allocator.page_ids(rid)

    def add_migrated_request(self, state):
        self.allocator.unpin(state.request_id)
        self.running[state.request_id] = state

    def abort(self, rid):
        self.running.pop(rid, None)
        return self.allocator.free(rid) > 0


class Wire:
    """Two units' fake transports: frames are queued for `deliver`, writes recorded with their futures."""

    def __init__(self):
        self.frames: list[tuple[str, bytes]] = []
        self.writes: list[tuple[str, object, Future]] = []
        self.counters: dict[tuple[str, int], tuple[int, Future]] = {}


class FakeTransfer:
    def __init__(self, wire: Wire, me: str):
        self.wire, self.me = wire, me
        self.cancelled: list[int] = []

    def add_peer(self, address: bytes) -> str:
        return address.decode()

    def send(self, peer: str, frame: bytes) -> Future:
        self.wire.frames.append((peer, frame))
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def submit(self, peer: str, batch) -> Future:
        fut: Future = Future()
        self.wire.writes.append((peer, batch, fut))
        return fut

    def expect(self, imm: int, count: int) -> Future:
        fut: Future = Future()
        self.wire.counters[(self.me, imm)] = (count, fut)
        return fut

    def cancel(self, imm: int) -> None:
        self.cancelled.append(imm)


def info(name: str) -> UnitInfo:
    region = RegionDescriptor(0, 1, NUM_PAGES * LAYERS * PAGE_BYTES, 0, 0).to_bytes()
    return UnitInfo(name, name, "decode", "inc", name.encode(), [region], b"", 0, 0)


def side(wire: Wire, name: str, page_bytes: int = PAGE_BYTES) -> KVMigrations:
    me = info(name)
    imms = iter(range(100, 200))
    m = KVMigrations(me, FakeEngine(page_bytes), FakeTransfer(wire, name), SPEC, FrameCodec(str(me.peer_id), SECRET),
                     pools=[SimpleNamespace(address=0, cuda_device=None)], deadline_s=5.0, next_imm=lambda: next(imms),
                     totals=TransferTotals())
    return m


@pytest.fixture
def pair():
    wire = Wire()
    a, b = side(wire, "decode-0"), side(wire, "decode-1")
    a.add_peer(info("decode-1"))
    b.add_peer(info("decode-0"))
    return wire, a, b


def deliver(wire: Wire, units: dict[str, KVMigrations]) -> None:
    """Hand every queued frame to its unit (a unit learns its peers' frames through its codec)."""
    while wire.frames:
        peer, frame = wire.frames.pop(0)
        opened = units[peer].codec.open(frame)
        assert not isinstance(opened, str), opened
        units[peer].on_frame(opened.message)


def accepted_move(wire: Wire, a: KVMigrations, b: KVMigrations) -> None:
    """Request "r" (9 computed tokens: 3 pages) offered by ``a``, accepted by ``b``, its writes submitted."""
    a.engine.start("r", computed=9)
    a.start("r", "decode-1")
    deliver(wire, {"decode-0": a, "decode-1": b})


def test_a_move_writes_every_page_of_every_layer_once_and_frees_the_source_after_admission(pair):
    wire, a, b = pair
    a.engine.start("r", computed=9)  # 3 pages
    a.start("r", "decode-1")
    assert a.engine.kv.suspended and a.busy
    deliver(wire, {"decode-0": a, "decode-1": b})  # offer -> accept -> writes
    [(count, counter)] = [v for k, v in wire.counters.items() if k[0] == "decode-1"]
    assert count == 3 * LAYERS  # pages x layers x ranks
    assert sum(len(batch.lengths) for _, batch, _ in wire.writes) == count
    assert {int(n) for _, batch, _ in wire.writes for n in batch.lengths} == {PAGE_BYTES}
    dst = b.engine.allocator.page_ids("r")
    assert sorted({o // PAGE_BYTES % NUM_PAGES for _, batch, _ in wire.writes for o in batch.dst_offsets}) == sorted(dst)
    assert a.engine.allocator.page_ids("r")  # not freed before the target has it
    for _, _, fut in wire.writes:
        fut.set_result(None)
    counter.set_result(None)
    b.poll()
    assert "r" in b.engine.running and [m.request_id for m in b.moved_in] == ["r"]
    assert b.moved_in[0].num_bytes == 3 * LAYERS * PAGE_BYTES
    deliver(wire, {"decode-0": a, "decode-1": b})  # admitted -> the source lets go
    assert not a.engine.allocator.page_ids("r") and a.engine.allocator.num_free_pages == NUM_PAGES
    assert [(e.request_id, e.moved) for e in a.ended] == [("r", True)] and not a.busy and not b.busy
    assert a.totals.counters.moved_out_bytes == b.totals.counters.moved_in_bytes == 3 * LAYERS * PAGE_BYTES


def test_a_target_of_another_shape_refuses_and_the_request_goes_on_at_the_source():
    wire = Wire()
    a, b = side(wire, "decode-0"), side(wire, "decode-1", page_bytes=128)
    a.add_peer(info("decode-1"))
    b.add_peer(info("decode-0"))
    a.engine.start("r", computed=5)
    a.start("r", "decode-1")
    deliver(wire, {"decode-0": a, "decode-1": b})
    assert "r" in a.engine.running and not wire.writes
    assert not a.ended[0].moved and "KV shapes differ" in a.ended[0].reason
    assert b.engine.allocator.num_free_pages == NUM_PAGES


def test_moves_that_cannot_start_leave_the_request_untouched(pair):
    wire, a, b = pair
    a.engine.start("r", computed=5)
    with pytest.raises(MigrationError, match="not a live decode unit"):
        a.start("r", "decode-9")
    with pytest.raises(MigrationError, match="on decode-0 already"):
        a.start("r", "decode-0")
    with pytest.raises(MigrationError, match="not running"):
        a.start("nobody", "decode-1")
    assert "r" in a.engine.running and not wire.frames


def test_a_target_past_its_deadline_waits_for_the_sources_drain_before_freeing(pair):
    wire, a, b = pair
    accepted_move(wire, a, b)
    now = time.monotonic()
    b.poll(now + 6)  # writes still out: refused, its grant held (a write may still land)
    assert b.engine.allocator.num_free_pages == NUM_PAGES - 3 and b.busy
    deliver(wire, {"decode-0": a, "decode-1": b})
    a.poll()
    assert "r" not in a.engine.running and not wire.frames  # its writes have not completed yet
    for _, _, fut in wire.writes:
        fut.set_result(None)
    a.poll()
    assert "r" in a.engine.running and not a.ended[0].moved and "deadline" in a.ended[0].reason
    deliver(wire, {"decode-0": a, "decode-1": b})  # MigrateCancel: the writes drained
    b.poll(time.monotonic() + DRAIN_GRACE_S + 0.01)
    assert b.engine.allocator.num_free_pages == NUM_PAGES and not b.busy


def test_an_abort_at_the_source_drops_the_request_once_its_writes_drained(pair):
    wire, a, b = pair
    accepted_move(wire, a, b)
    assert a.abort("r")
    assert a.engine.allocator.page_ids("r")  # writes still read its pages
    for _, _, fut in wire.writes:
        fut.set_result(None)
    a.poll()
    assert not a.engine.allocator.page_ids("r") and "r" not in a.engine.running
    deliver(wire, {"decode-0": a, "decode-1": b})
    b.poll(time.monotonic() + DRAIN_GRACE_S + 0.01)
    assert b.engine.allocator.num_free_pages == NUM_PAGES and "r" not in b.engine.running


def test_a_dead_target_resumes_the_request_and_a_dead_source_quarantines_the_grant(pair):
    wire, a, b = pair
    accepted_move(wire, a, b)
    now = time.monotonic()
    a.peer_down("decode-1", now)
    assert "r" in a.engine.running and "went down" in a.ended[0].reason
    b.peer_down("decode-0", now)
    b.poll(now + DEAD_PEER_GRACE_S / 2)
    assert b.engine.allocator.num_free_pages == NUM_PAGES - 3  # writes on the wire may still land
    b.poll(now + DEAD_PEER_GRACE_S + 0.01)
    assert b.engine.allocator.num_free_pages == NUM_PAGES and not b.busy


def test_a_grant_outside_the_targets_pool_is_never_written(pair):
    wire, a, b = pair
    a.engine.start("r", computed=5)
    a.start("r", "decode-1")
    peer, frame = wire.frames.pop(0)
    offer = b.codec.open(frame).message
    forged = pr.MigrateAccept("r", offer.migration, 7, [pr.DestinationRank(0, info("decode-1").pool_regions[0],
                                                                           [0, NUM_PAGES + 3])])
    a.on_frame(forged)
    assert not wire.writes and "r" in a.engine.running and "outside its pool" in a.ended[0].reason


def test_a_move_its_router_calls_off_resumes_at_the_source_once_no_write_is_in_flight(pair):
    """The router judged the target unreachable (`CancelMove`): the source does not wait for its deadline."""
    wire, a, b = pair
    a.engine.start("r", computed=9)
    a.start("r", "decode-1")  # offered; the target's answer has not come
    assert a.cancel("r", "decode-1 is unreachable")
    assert "r" in a.engine.running and [(e.moved, e.reason) for e in a.ended] == [(False, "decode-1 is unreachable")]
    assert not a.cancel("r", "again") and not a.busy  # nothing of it moves any more
    deliver(wire, {"decode-0": a, "decode-1": b})  # the target reads the offer, then the cancel: it frees its grant
    b.poll(time.monotonic() + DRAIN_GRACE_S + 0.01)
    assert b.engine.allocator.num_free_pages == NUM_PAGES and not b.busy
    # once its pages are being written, the source resumes it only when every write completed
    a.engine.start("s", computed=9)
    a.start("s", "decode-1")
    deliver(wire, {"decode-0": a, "decode-1": b})
    assert a.cancel("s", "decode-1 is unreachable")
    a.poll()
    assert "s" not in a.engine.running and len(a.ended) == 1
    for _, _, fut in wire.writes:
        fut.set_result(None)
    a.poll()
    assert "s" in a.engine.running and not a.ended[-1].moved and not a.busy
