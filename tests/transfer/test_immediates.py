"""Immediate counters: fire once at the right count, across senders, requests and early arrivals."""

from __future__ import annotations

import asyncio
import itertools
import random
import time

import pytest

from disaggsdk.transfer import TransferError

PAGE = 4096
_imms = itertools.count(2_000_000)


def _write(target, sender_idx, pages, imm):
    reply = target.senders[sender_idx].call("write", [p * PAGE for p in pages],
                                            [p * PAGE for p in pages], PAGE, imm)
    assert reply[0] == "ok", reply


def _wait_received(target, total, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while target.engine.stats()["imm_received"] < total:
        assert time.monotonic() < deadline, "immediates did not arrive"
        time.sleep(0.005)


def test_interleaved_requests_from_several_senders(target):
    rng = random.Random(7)
    requests = {next(_imms): rng.randint(3, 12) for _ in range(4)}
    # entries of every request, scattered over both senders and shuffled together;
    # pages are never contiguous so each entry is its own write
    entries = [(imm, i) for imm, n in requests.items() for i in range(n)]
    rng.shuffle(entries)
    base = target.engine.stats()["imm_received"]
    early = list(requests)[:2]  # these are expected only after all their writes landed
    futures = {imm: target.engine.expect(imm, requests[imm]) for imm in requests if imm not in early}
    for k, (imm, _) in enumerate(entries):
        _write(target, k % 2, [2 * k], imm)
    _wait_received(target, base + len(entries))
    for imm in early:
        futures[imm] = target.engine.expect(imm, requests[imm])
    for fut in futures.values():
        assert fut.result(timeout=10) is None
    assert target.engine.stats()["imm_late"] == 0


def test_fires_only_at_the_count_and_late_ones_are_dropped(target):
    imm = next(_imms)
    fut = target.engine.expect(imm, 3)
    base = target.engine.stats()
    _write(target, 0, [0], imm)
    _write(target, 1, [2], imm)
    _wait_received(target, base["imm_received"] + 2)
    time.sleep(0.05)
    assert not fut.done(), "fired before its count"
    _write(target, 0, [4], imm)
    fut.result(timeout=10)
    _write(target, 1, [6], imm)  # a duplicate after firing: counted late, no second event
    _wait_received(target, base["imm_received"] + 4)
    assert target.engine.stats()["imm_late"] == base["imm_late"] + 1
    # a retired immediate may be expected again (a new incarnation), but not twice at once
    target.engine.expect(imm, 1)
    with pytest.raises(TransferError, match="already"):
        target.engine.expect(imm, 1)
    target.engine.cancel(imm)


def test_cancel_drops_later_arrivals(target):
    imm = next(_imms)
    fut = target.engine.expect(imm, 2)
    target.engine.cancel(imm)
    assert fut.cancelled()
    base = target.engine.stats()
    _write(target, 0, [8, 10], imm)
    _wait_received(target, base["imm_received"] + 2)
    assert target.engine.stats()["imm_late"] == base["imm_late"] + 2


def test_merged_writes_count_every_entry(target):
    imm = next(_imms)
    fut = target.engine.expect(imm, 16)
    _write(target, 1, list(range(100, 116)), imm)  # contiguous: one write carrying 16
    fut.result(timeout=10)


def test_completion_in_asyncio(target):
    imm = next(_imms)

    async def main():
        fut = asyncio.wrap_future(target.engine.expect(imm, 2))
        await asyncio.get_running_loop().run_in_executor(None, _write, target, 0, [20, 22], imm)
        await asyncio.wait_for(fut, 10)

    asyncio.run(main())
