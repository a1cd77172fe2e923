"""UnitHeartbeat: heartbeats cross the unit's channel from a thread of their own, whatever the
unit's loop does, and stop when told or when the runtime's end goes."""

from __future__ import annotations

import socket
import time

from disaggsdk.launch import messages as ch
from disaggsdk.launch.channel import FrameChannel
from disaggsdk.launch.unit_heartbeat import BEATS_PER_UNREACHABLE, UnitHeartbeat


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
