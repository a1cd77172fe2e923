"""The anti-replay window: each frame number is taken once per sender; late frames within the window pass."""

from __future__ import annotations

from disaggsdk.messenger.freshness import REPLAYED, UNSEQUENCED, FrameNumbers, ReplayGuard


def test_each_number_is_taken_once_and_senders_are_apart():
    guard = ReplayGuard(window_frames=8)
    assert guard.check("d#1", 1) is None and guard.check("d#1", 2) is None
    assert guard.check("d#1", 2) == REPLAYED
    assert guard.check("d#2", 2) is None  # a restarted unit is a new sender
    assert guard.check("", 3) == UNSEQUENCED and guard.check("d#1", 0) == UNSEQUENCED


def test_reordering_within_the_window_passes_and_older_frames_are_refused():
    guard = ReplayGuard(window_frames=8)
    assert guard.check("p", 10) is None
    assert guard.check("p", 5) is None  # late but within the window: an honest reordering
    assert guard.check("p", 5) == REPLAYED
    assert guard.check("p", 2) == REPLAYED  # at or below highest - window: too old to tell apart


def test_memory_stays_bounded_over_a_long_run():
    guard, numbers = ReplayGuard(window_frames=16), FrameNumbers()
    for _ in range(10_000):
        assert guard.check("p", numbers.next()) is None
    assert len(guard._seen["p"]) <= 2 * 16 + 1
    assert guard.check("p", 10_000) == REPLAYED and guard.check("p", 10_001) is None
