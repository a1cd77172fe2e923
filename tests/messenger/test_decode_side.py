"""The decode side's rules with a fake transport and engine: nothing is freed while a write may
land, a deadline retries on another prefill unit, stale and forged reports are counted."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.context import context_bytes, pack_context
from disaggsdk.messenger.decode_side import DecodeMessenger
from disaggsdk.messenger.handoff import DRAIN_GRACE_S
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.plan import make_plan
from tests.messenger._engine_pages import EnginePages
from tests.plan.helpers import make_spec

SECRET = b"decode-side-test-secret-01234567"
NUM_PAGES, PAGE_SIZE, HIDDEN, VOCAB = 16, 4, 8, 12


_PREFILL_SEQ = itertools.count(1)


def from_prefill(message: pr.Message, secret: bytes = SECRET) -> bytes:
    """A frame as prefill-0 would send it: its sender id and the next number of its sequence."""
    return pr.encode_message(message, secret, "prefill-0#inc", next(_PREFILL_SEQ))


class FakeTransfer:
    def __init__(self):
        self.sent: list[tuple[str, pr.Message]] = []
        self.counters: dict[int, tuple[int, Future]] = {}
        self.cancelled: list[int] = []

    def add_peer(self, address: bytes) -> str:
        return address.decode()

    def expect(self, imm: int, count: int) -> Future:
        fut: Future = Future()
        self.counters[imm] = (count, fut)
        return fut

    def cancel(self, imm: int) -> None:
        self.cancelled.append(imm)

    def send(self, peer: str, frame: bytes) -> Future:
        self.sent.append((peer, pr.decode_message(frame, SECRET)))
        fut: Future = Future()
        fut.set_result(None)
        return fut


class FakeEngine(EnginePages):
    def __init__(self):
        self.config = SimpleNamespace(page_size=PAGE_SIZE)
        self.arch = SimpleNamespace(hidden_size=HIDDEN, vocab_size=VOCAB)
        super().__init__(NUM_PAGES, PAGE_SIZE)  # the page contract, over a real allocator
        self.cache = SimpleNamespace(fmt=SimpleNamespace(num_layers=4, page_bytes=64))
        self.admitted: list[str] = []
        self.local: list[str] = []

    def share_cached_prompt(self, request_id, prompt_ids, count=True):
        return 0  # no prefix cache here: tests/messenger/test_decode_prefix_hit.py has one

    def add_prefilled_request(self, request_id, prompt_ids, params, num_cached_tokens=0):
        self.admitted.append(request_id)

    def add_request(self, request_id, prompt_ids, params):
        self.local.append(request_id)


def unit(name: str, role: str) -> UnitInfo:
    return UnitInfo(name, name, role, "inc", name.encode(), [b"pool-" + name.encode()], b"ctx-" + name.encode(),
                    context_bytes(HIDDEN, VOCAB), 4)


@pytest.fixture
def side():
    plan = make_plan(make_spec(1, 1, model="qwen3-coder-tiny", p_replicas=2, page_size=PAGE_SIZE, dtype="float32"))
    engine, transfer = FakeEngine(), FakeTransfer()
    context = memoryview(bytearray(4 * context_bytes(HIDDEN, VOCAB)))
    dm = DecodeMessenger(unit("decode-0", "decode"), engine, transfer, plan, context, SECRET, deadline_s=5.0)
    for name in ("prefill-0", "prefill-1"):
        dm.add_prefill(unit(name, "prefill"))
    return dm, engine, transfer, context


def last(transfer, kind):
    return [(peer, m) for peer, m in transfer.sent if isinstance(m, kind)][-1]


def test_deadline_retry_keeps_old_pages_until_the_drain_report(side, caplog):
    dm, engine, transfer, context = side
    dm.submit("r", list(range(9)), None)  # 8 tokens move: 2 pages
    peer, first = last(transfer, pr.PrefillRequest)
    assert peer == "prefill-0" and first.destinations[0].page_ids == engine.allocator.page_ids("r")
    count, _ = transfer.counters[first.imm]
    assert count == 2 * 4 + 1  # pages x layers + context, as the planner says
    now = time.monotonic()
    with caplog.at_level("WARNING", logger="disaggsdk.messenger.decode_side"):
        dm.poll(now + 6)  # past the deadline
    assert [r.getMessage() for r in caplog.records] == [
        "request r: KV handoff attempt 1 from prefill-0 failed: prefill-0 missed the 5 s deadline; retrying"]
    peer, abort = last(transfer, pr.AbortPrefill)
    assert peer == "prefill-0" and (abort.request_id, abort.generation) == ("r", first.generation)
    assert first.imm in transfer.cancelled
    peer, second = last(transfer, pr.PrefillRequest)
    assert peer == "prefill-1" and not set(second.destinations[0].page_ids) & set(first.destinations[0].page_ids)
    assert engine.allocator.num_free_pages == NUM_PAGES - 4  # old pages parked, new ones granted
    dm.poll(now + 10)  # (the second attempt's deadline is at now + 11)
    assert engine.allocator.num_free_pages == NUM_PAGES - 4  # no report, no free: a write may still land
    dm.on_frame(from_prefill(pr.PrefillFailed("r", first.generation, "aborted")))
    dm.poll(time.monotonic() + DRAIN_GRACE_S + 0.01)
    assert engine.allocator.num_free_pages == NUM_PAGES - 2
    # the second attempt lands: context in its slot, then every write counted
    slot = second.context.offset_bytes
    pack_context(context[slot:slot + second.context.length_bytes], [0.0] * HIDDEN, [0.0] * VOCAB, time.monotonic())
    transfer.counters[second.imm][1].set_result(None)
    dm.poll()
    assert engine.admitted == ["r"] and engine.allocator.page_ids("r") == second.destinations[0].page_ids
    assert dm.totals.counters.requests_retried == 1 and dm.totals.recent[-1].attempts == 2


def test_rejection_retries_at_once_and_the_last_resort_is_local(side, caplog):
    dm, engine, transfer, _ = side
    dm.submit("r", list(range(6)), None)
    with caplog.at_level("WARNING", logger="disaggsdk.messenger.decode_side"):
        for _ in range(2):
            _, req = last(transfer, pr.PrefillRequest)
            dm.on_frame(from_prefill(pr.PrefillRejected("r", req.generation, "overloaded")))
    assert engine.local == ["r"] and dm.totals.counters.prefilled_locally == 1
    assert caplog.records[-1].getMessage() == "request r: prefilling it here after 2 failed KV handoff attempt(s)"
    dm.poll(time.monotonic() + 1)
    assert engine.allocator.num_free_pages == NUM_PAGES  # rejected attempts never wrote: all free


def test_stale_forged_and_wrong_kind_frames_are_counted(side):
    dm, engine, transfer, _ = side
    dm.submit("r", list(range(6)), None)
    dm.on_frame(from_prefill(pr.PrefillFailed("r", 999, "old")))
    dm.on_frame(from_prefill(pr.PrefillFailed("r", 1, "x"), b"z" * 32))
    dm.on_frame(from_prefill(pr.AbortPrefill("r", 1)))
    dm.on_frame(b"\x00" * 10)
    replayed = from_prefill(pr.PrefillFailed("r", 998, "old"))
    dm.on_frame(replayed)
    dm.on_frame(replayed)  # a captured frame sent again: refused before it is read
    dm.on_frame(pr.encode_message(pr.PrefillFailed("r", 1, "x"), SECRET))  # no sender, no number
    assert dm.frames.by_reason == {"stale": 2, "BadMac": 1, "unexpected_kind": 1, "MalformedFrame": 1,
                                   "replayed": 1, "unsequenced": 1}
    assert dm.num_waiting == 1 and engine.allocator.page_ids("r")  # the live attempt is untouched


def test_dead_prefill_retries_and_frees_after_a_grace(side):
    dm, engine, transfer, _ = side
    dm.submit("r", list(range(9)), None)
    now = time.monotonic()
    dm.peer_down("prefill-0", now)
    peer, _ = last(transfer, pr.PrefillRequest)
    assert peer == "prefill-1" and not [m for p, m in transfer.sent if isinstance(m, pr.AbortPrefill)]
    dm.poll(now + 0.1)
    assert engine.allocator.num_free_pages == NUM_PAGES - 4
    dm.poll(now + 2)
    assert engine.allocator.num_free_pages == NUM_PAGES - 2


def test_abort_during_the_handoff_waits_for_the_drain(side):
    dm, engine, transfer, _ = side
    dm.submit("r", list(range(9)), None)
    assert dm.abort("r") and not dm.abort("r")
    _, abort = last(transfer, pr.AbortPrefill)
    assert abort.decode_instance == "decode-0#inc"
    dm.poll(time.monotonic() + 60)
    assert engine.allocator.num_free_pages == NUM_PAGES - 2
    dm.on_frame(from_prefill(pr.PrefillFailed("r", abort.generation, "aborted: nothing in flight")))
    dm.poll(time.monotonic() + 1)
    assert engine.allocator.num_free_pages == NUM_PAGES and dm.frames.total == 0
