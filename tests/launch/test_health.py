"""launch.health: the heartbeat crosses the unit's channel from a thread of its own and stops when
told or when the runtime's end goes; a unit silent for its limit is reported once (`SilenceWatch`);
silent units are asked for their stats, then stalled, and live again when they speak (`StallWatch`);
a unit gives up on its transport when its thread is stuck, and names whom it blames
(`TransportWatchdog`)."""

from __future__ import annotations

import socket
import time

from disaggsdk.launch import messages as ch
from disaggsdk.launch.channel import FrameChannel
from disaggsdk.launch.health import (
    BEATS_PER_UNREACHABLE,
    CHECK_EVERY_S,
    SilenceWatch,
    StallWatch,
    TransportWatchdog,
    UnitHeartbeat,
)
from disaggsdk.transfer.descriptors import Peer

# unreachable: UnitHeartbeat, SilenceWatch


def _pair():
    unit_end, runtime_end = socket.socketpair()
    return FrameChannel(unit_end, ch.TO_UNIT), FrameChannel(runtime_end, ch.FROM_UNIT)


def test_heartbeats_arrive_while_the_loop_is_busy_and_stop_when_told():
    unit, runtime = _pair()
    beat = UnitHeartbeat.for_unreachable_s(unit, 0.2)
    assert beat.interval_s == 0.2 / BEATS_PER_UNREACHABLE
    beat.start()
    time.sleep(0.5)  # the loop's long step: this thread sends nothing meanwhile
    beats = 0
    while runtime.poll(0):
        assert isinstance(runtime.recv(), ch.Heartbeat)
        beats += 1
    assert beats >= 3
    beat.stop()
    time.sleep(0.2)  # one already under way may land
    while runtime.poll(0):
        runtime.recv()
    time.sleep(0.3)
    assert not runtime.poll(0)


def test_a_closed_channel_ends_the_heartbeat_thread():
    unit, runtime = _pair()
    beat = UnitHeartbeat(unit, 0.01)
    beat.start()
    runtime.close()
    beat._thread.join(5)
    assert not beat._thread.is_alive()


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


# stalled: StallWatch


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


# stuck in its transport: TransportWatchdog


class FakeTransfer:
    """A transfer engine whose `health` reads are set by the test."""

    def __init__(self) -> None:
        self.age_s, self.posting = 0.0, None
        self.health = self

    def round_age_s(self) -> float:
        return self.age_s

    def posting_to(self):
        return self.posting


def test_a_thread_going_round_is_never_reported():
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=5.0)
    transfer.age_s = 4.9
    assert all(dog.check(t * CHECK_EVERY_S) is None for t in range(20))


def test_a_stuck_thread_names_the_peer_it_was_sending_to():
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=5.0)
    dog.know_peer(b"addr-d0", "decode-0#a1")
    assert dog.check(100.0) is None
    transfer.age_s, transfer.posting = 5.5, Peer(3, b"addr-d0")
    stuck = dog.check(100.0 + CHECK_EVERY_S)
    assert stuck is not None and stuck.poisoned_peer == "decode-0#a1" and stuck.stuck_s == 5.5


def test_stuck_reading_its_own_queue_blames_nobody_and_checks_are_spaced():
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=1.0)
    assert dog.check(10.0) is None
    transfer.age_s = 3.0
    assert dog.check(10.0 + CHECK_EVERY_S / 2) is None  # not looked at again so soon
    stuck = dog.check(10.0 + CHECK_EVERY_S)
    assert stuck is not None and stuck.poisoned_peer is None


def test_an_address_it_never_learnt_is_still_reported():
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=1.0)
    transfer.age_s, transfer.posting = 2.0, Peer(0, b"somebody")
    assert dog.check(0.0) is None  # the first check only starts the count
    assert dog.check(CHECK_EVERY_S).poisoned_peer == "unknown peer"


def test_a_whole_process_stopped_longer_than_the_limit_is_not_a_stuck_thread():
    """SIGSTOP (or a paused VM) stops the loop and the thread alike: at the loop's first check after
    it, the thread's round is as old as the stop. It gets until the next check to go round."""
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=5.0)
    assert dog.check(10.0) is None
    transfer.age_s = 6.1  # stopped 6 s between two rounds of the loop
    assert dog.check(16.1) is None
    transfer.age_s = 0.0  # continued: the thread went round
    assert dog.check(16.1 + CHECK_EVERY_S) is None
    transfer.age_s = 7.0  # really stuck: the next check close after this one reports it
    assert dog.check(16.1 + 2 * CHECK_EVERY_S) is not None
