"""Control messages round-trip between processes and are bounded in size."""

from __future__ import annotations

import os

import pytest

from disaggsdk.transfer import TransferError


@pytest.mark.parametrize("size", [0, 17, 65536])
def test_round_trip(target, size):
    payload = os.urandom(size)
    target.senders[1].conn.send(("echo",))
    target.engine.send(target.peers[1], payload).result(timeout=30)
    assert target.engine.recv(timeout_s=30) == payload
    assert target.senders[1].conn.poll(30) and target.senders[1].conn.recv() == ("ok",)


def test_oversized_message_is_refused(target):
    with pytest.raises(TransferError, match="exceeds"):
        target.engine.send(target.peers[0], bytes(target.engine.max_control_bytes + 1))


def test_recv_times_out(target):
    with pytest.raises(TransferError, match="no control message"):
        target.engine.recv(timeout_s=0.05)


def test_an_arriving_message_makes_the_wake_fd_readable(target):
    """The pump writes `engine.wake` when a control message arrives; `clear` resets it."""
    import select

    target.engine.wake.clear()
    target.senders[1].conn.send(("echo",))
    target.engine.send(target.peers[1], b"ping").result(timeout=30)
    readable, _, _ = select.select([target.engine.wake], [], [], 30)
    assert readable, "the wake fd never became readable"
    assert target.engine.recv(timeout_s=30) == b"ping"
    assert target.senders[1].conn.poll(30) and target.senders[1].conn.recv() == ("ok",)
    target.engine.wake.clear()
    assert select.select([target.engine.wake], [], [], 0)[0] == []
