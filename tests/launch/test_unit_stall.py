"""StallWatch: silent units are asked for their stats, then stalled, and live again when they speak."""

from __future__ import annotations

from disaggsdk.launch.unit_stall import StallWatch


def test_a_silent_unit_is_probed_then_stalled_and_speaking_ends_the_stall():
    watch = StallWatch(stall_s=8.0, names=["a", "b"], now_s=0.0)
    assert watch.check(["a", "b"], 1.0) == ([], [])
    assert watch.check(["a", "b"], 2.0) == ([], ["a", "b"])  # a quarter of the stall time: asked
    assert watch.check(["a", "b"], 3.0) == ([], [])  # not asked again within a quarter
    watch.heard("b", 3.5)
    assert watch.check(["a", "b"], 4.0) == ([], ["a"])
    assert watch.check(["a", "b"], 8.0) == (["a"], ["b"])
    assert watch.is_silent("a") and not watch.is_silent("b")
    assert watch.check(["a", "b"], 9.0) == ([], [])  # reported once
    assert watch.check(["a"], 12.0) == ([], ["a"])  # 8 s since it was last asked
    assert watch.check(["a"], 16.0) == ([], [])  # a stalled unit is asked once a stall time only
    assert watch.check(["a"], 20.0) == ([], ["a"])
    assert watch.heard("a", 21.0) and not watch.is_silent("a")
    assert not watch.heard("a", 21.5)


def test_a_restarted_unit_starts_heard_and_not_stalled():
    watch = StallWatch(stall_s=4.0, names=["a"], now_s=0.0)
    assert watch.check(["a"], 5.0) == (["a"], ["a"])
    watch.restarted("a", 6.0)
    assert not watch.is_silent("a") and watch.silent_s("a", 6.5) == 0.5
    assert watch.check(["a"], 6.5) == ([], [])
