"""SilenceWatch: a unit silent for its limit is reported once, and heard again it is not silent."""

from __future__ import annotations

from disaggsdk.launch.unit_silence import SilenceWatch


def test_a_unit_silent_for_the_limit_is_reported_once_until_it_is_heard_again():
    watch = SilenceWatch(limit_s=4.0, names=["a", "b"], now_s=0.0)
    assert watch.newly_silent(["a", "b"], 3.9) == []
    watch.heard("b", 3.0)  # a heartbeat
    assert watch.newly_silent(["a", "b"], 4.0) == ["a"]
    assert watch.is_silent("a") and not watch.is_silent("b")
    assert watch.newly_silent(["a", "b"], 6.0) == []  # reported once
    assert watch.silent_s("a", 6.0) == 6.0
    assert watch.heard("a", 6.5) and not watch.is_silent("a")
    assert not watch.heard("a", 7.0)  # not silent: nothing ends
    assert watch.newly_silent(["a", "b"], 7.5) == ["b"]  # 4.5 s since b's heartbeat


def test_only_live_units_are_reported_and_a_restarted_one_starts_heard():
    watch = SilenceWatch(limit_s=2.0, names=["a", "b"], now_s=0.0)
    assert watch.newly_silent(["b"], 5.0) == ["b"]  # "a" is down: not watched
    watch.restarted("b", 5.5)
    assert not watch.is_silent("b") and watch.silent_s("b", 6.0) == 0.5
    assert watch.newly_silent(["a", "b"], 6.0) == ["a"]
