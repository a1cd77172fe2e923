"""The launcher <-> unit channel: typed, versioned frames over a socket; nothing unpickled, nothing guessed."""

from __future__ import annotations

import socket

import pytest

from disaggsdk.launch import messages as m
from disaggsdk.launch.base import ChannelClosed, ChannelError
from disaggsdk.launch.channel import HEADER, MAX_FRAME_BYTES, FrameChannel


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    runtime_end, unit_end = FrameChannel(a, m.FROM_UNIT), FrameChannel(b, m.TO_UNIT)
    yield runtime_end, unit_end
    runtime_end.close()
    unit_end.close()


def test_messages_cross_both_ways_with_their_types(pair):
    runtime_end, unit_end = pair
    args = m.UnitArgs("decode-0", "decode-0", "decode", "model: x\n", b"\x00secret", "shm", "/tmp/l", "/tmp/w",
                      cpu_ids=(0, 1), parent_pid=42)
    runtime_end.send(args)
    runtime_end.send(m.GetStats(7, with_recent=True))
    assert unit_end.recv(timeout_s=5) == args
    assert unit_end.recv(timeout_s=5) == m.GetStats(7, with_recent=True)
    unit_end.send(m.Tokens("r1", [3, 4], finished=True, finish_reason="length",
                           logprobs=[m.Logprob(3, -0.5, [(3, -0.5), (9, -1.0)])]))
    got = runtime_end.recv(timeout_s=5)
    assert isinstance(got, m.Tokens) and got.token_ids == [3, 4] and got.logprobs[0].top == [(3, -0.5), (9, -1.0)]


def test_a_frame_split_across_reads_is_reassembled_and_poll_waits_for_all_of_it():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    receiver = FrameChannel(b, m.TO_UNIT)
    try:
        import msgspec

        payload = msgspec.msgpack.encode(m.Abort("r9"))
        frame = HEADER.pack(len(payload), m.PROTOCOL_VERSION) + payload
        a.sendall(frame[:3])
        assert not receiver.poll(0.05)
        a.sendall(frame[3:])
        assert receiver.poll(1.0) and receiver.recv() == m.Abort("r9")
    finally:
        a.close()
        receiver.close()


@pytest.mark.parametrize("header, why", [
    (HEADER.pack(4, m.PROTOCOL_VERSION + 1), "protocol version"),
    (HEADER.pack(MAX_FRAME_BYTES + 1, m.PROTOCOL_VERSION), "limit"),
])
def test_a_frame_of_another_version_or_absurd_size_is_refused(header, why):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    receiver = FrameChannel(b, m.TO_UNIT)
    try:
        a.sendall(header + b"\x00" * 4)
        with pytest.raises(ChannelError, match=why):
            receiver.recv(timeout_s=1)
    finally:
        a.close()
        receiver.close()


def test_a_message_the_side_does_not_take_is_refused_not_guessed(pair):
    runtime_end, unit_end = pair
    unit_end.send(m.GetStats(1))  # a runtime -> unit message sent the wrong way
    with pytest.raises(ChannelError, match="not a message"):
        runtime_end.recv(timeout_s=5)


def test_a_closed_end_is_reported_once_its_frames_are_read(pair):
    runtime_end, unit_end = pair
    unit_end.send(m.Started("u"))
    unit_end.close()
    assert runtime_end.recv(timeout_s=5) == m.Started("u")
    with pytest.raises(ChannelClosed):
        runtime_end.recv(timeout_s=5)


def test_recv_waits_no_longer_than_asked():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    quiet = FrameChannel(a, m.TO_UNIT)
    try:
        with pytest.raises(TimeoutError):
            quiet.recv(timeout_s=0.05)
    finally:
        quiet.close()
        b.close()


def test_poll_also_wakes_on_another_descriptor_without_a_frame(pair):
    """A unit waits on its channel and its transport's wake fd together: the fd ends the wait early."""
    import os
    import time

    _, unit_end = pair
    wake = os.eventfd(0, os.EFD_NONBLOCK)
    try:
        t = time.monotonic()
        assert unit_end.poll(0.05, (wake,)) is False and time.monotonic() - t >= 0.04  # nothing: full wait
        os.eventfd_write(wake, 1)
        t = time.monotonic()
        assert unit_end.poll(10.0, (wake,)) is False and time.monotonic() - t < 5  # woken, no frame
    finally:
        os.close(wake)
