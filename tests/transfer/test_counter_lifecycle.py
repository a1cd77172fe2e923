"""Immediate-counter lifecycle edge cases on one engine (no traffic needed)."""

from __future__ import annotations

import pytest

from disaggsdk.transfer import TransferError


@pytest.fixture(scope="module")
def engine():
    from disaggsdk.transfer import TransferEngine

    with TransferEngine("shm") as eng:
        yield eng


def test_count_zero_fires_at_once(engine):
    engine.expect(5, 0).result(timeout=5)


def test_expect_again_after_fire_is_a_new_incarnation(engine):
    engine.expect(6, 0).result(timeout=5)
    fut = engine.expect(6, 1)
    assert not fut.done()
    engine.cancel(6)
    assert fut.cancelled()


def test_many_retired_counters_are_forgotten_without_harm(engine):
    # more retirements than the native table remembers: pruning must not lose live counters
    live = engine.expect(7, 1)
    for imm in range(100_000, 110_000):
        engine.expect(imm, 0).result(timeout=5)
    assert not live.done()
    engine.cancel(7)
    assert engine.stats()["imm_late"] == 0


def test_cancel_of_unknown_immediate_is_harmless(engine):
    engine.cancel(123456789)
    fut = engine.expect(123456789, 0)  # a new incarnation after the cancel
    fut.result(timeout=5)


def test_closed_engine_fails_pending_futures():
    from disaggsdk.transfer import TransferEngine

    eng = TransferEngine("shm")
    fut = eng.expect(1, 10)
    eng.close()
    with pytest.raises(TransferError, match="closed"):
        fut.result(timeout=5)
