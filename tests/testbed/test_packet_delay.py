"""The user-space packet delayer (`disaggsdk.testbed.packet_delay`): its loop against a queue of
its own making (each packet released at its own draw, in draw order; everything held released at
a stop), its reading of nfnetlink_queue's messages, and a start that fails leaving nothing behind.
The delayer on a live link is tested with the jitter in test_link_faults."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import threading
import time

import pytest

from disaggsdk.testbed import TestbedError, add_jitter, link_faults, netem_available, packet_delay
from disaggsdk.testbed.link_faults import JITTER_QUEUE_BASE
from disaggsdk.testbed.nfqueue_delayer import READY_LINE, _attribute, _packet_ids, run_delayer
from tests.testbed.conftest import pids_in_netns

STOP_BOUND_S = 10.0  # a loop still running this long after its stop hangs


class _Queue:
    """A stand-in for `NfQueue`: ``arrive`` queues ids; the loop's verdicts are kept in order, and
    once ``stop_after`` of them were given the stop pipe is written."""

    def __init__(self, stop_after: int) -> None:
        self._readable, self._wake = os.pipe()
        self.stop_read, self._stop_write = os.pipe()
        self._arrived: list[int] = []
        self._lock = threading.Lock()
        self.accepted: list[int] = []
        self.stop_after = stop_after

    def fileno(self) -> int:
        return self._readable

    def arrive(self, packet_ids: list[int]) -> None:
        with self._lock:
            self._arrived += packet_ids
        os.write(self._wake, b"x")

    def receive(self):
        os.read(self._readable, 4096)  # the loop asks only when the pipe is readable
        with self._lock:
            arrived, self._arrived = self._arrived, []
        yield from arrived

    def accept(self, packet_ids: list[int]) -> None:
        self.accepted += packet_ids
        if len(self.accepted) >= self.stop_after:
            self.stop()

    def stop(self) -> None:
        os.write(self._stop_write, b"x")

    def close(self) -> None:
        for fd in (self._readable, self._wake, self.stop_read, self._stop_write):
            os.close(fd)


def _run(queue: _Queue, delay_ms: float, jitter_ms: float, seed: int, delayed: list[int]) -> threading.Thread:
    # the loop in a thread; how many packets it delayed lands in ``delayed``
    thread = threading.Thread(target=lambda: delayed.append(
        run_delayer(queue, delay_ms, jitter_ms, random.Random(seed), queue.stop_read)), daemon=True)
    thread.start()
    return thread


def _is_delayer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"packet_delay" in f.read()
    except OSError:
        return False


def test_each_packet_is_released_at_its_own_draw_so_a_shorter_draw_overtakes():
    """Twenty packets arrive at once with 5 ± 5 ms: they leave in the order of their draws (the
    same seed's draws), not in arrival order, as netem's jitter reorders."""
    ids = list(range(100, 120))
    rng = random.Random(7)
    expected_draws = {packet_id: rng.uniform(0.0, 0.01) for packet_id in ids}  # the loop's draws, in arrival order
    queue = _Queue(stop_after=len(ids))
    try:
        delayed: list[int] = []
        thread = _run(queue, 5, 5, seed=7, delayed=delayed)
        queue.arrive(ids)
        thread.join(STOP_BOUND_S)
        assert not thread.is_alive()
        assert queue.accepted == sorted(ids, key=expected_draws.__getitem__)
        assert queue.accepted != ids  # some overtook (with this seed, most)
        assert delayed == [len(ids)]
    finally:
        queue.close()


def test_without_jitter_every_packet_waits_the_delay_and_keeps_its_order():
    ids = list(range(50))
    queue = _Queue(stop_after=len(ids))
    try:
        started = time.monotonic()
        thread = _run(queue, 30, 0, seed=1, delayed=[])
        queue.arrive(ids)
        thread.join(STOP_BOUND_S)
        assert not thread.is_alive()
        assert queue.accepted == ids
        assert time.monotonic() - started >= 0.030  # none left before the delay
    finally:
        queue.close()


def test_a_stop_releases_every_packet_still_held_at_once():
    """A heal must not drop what the delayer holds (closing the queue would): a stop accepts it all now."""
    queue = _Queue(stop_after=10**9)
    try:
        thread = _run(queue, 60_000, 0, seed=1, delayed=[])  # a minute: only the stop can release them
        queue.arrive([1, 2, 3])
        time.sleep(0.2)
        assert queue.accepted == []
        queue.stop()
        thread.join(STOP_BOUND_S)
        assert not thread.is_alive() and queue.accepted == [1, 2, 3]
    finally:
        queue.close()


def _packet_message(packet_id: int, extra_attribute: bytes = b"") -> bytes:
    # nfnetlink_queue's NFQNL_MSG_PACKET as the kernel sends it with NFQNL_COPY_META: nlmsghdr,
    # nfgenmsg, NFQA_PACKET_HDR (id, hw protocol, hook: 7 bytes, padded), further attributes
    body = struct.pack("!BBH", 2, 0, 39) + extra_attribute + \
        _attribute(1, struct.pack("!IHB", packet_id, 0x0800, 4))
    return struct.pack("=IHHII", 16 + len(body), 3 << 8, 0, 0, 0) + body


def test_packet_ids_are_read_from_each_message_of_a_datagram():
    mark = _attribute(3, struct.pack("!I", 0xABCD))  # NFQA_MARK before the header: skipped by its length
    data = _packet_message(7) + _packet_message(2**32 - 1, mark)
    assert list(_packet_ids(memoryview(data))) == [7, 2**32 - 1]
    # a message of another kind (an error answer) carries no packet
    error = struct.pack("=IHHII", 36, 2, 0, 0, 0) + struct.pack("=i", 0) + b"\0" * 16
    assert list(_packet_ids(memoryview(error + _packet_message(9)))) == [9]


def test_an_attribute_is_padded_to_four_bytes_and_counts_its_unpadded_length():
    params = _attribute(2, struct.pack("!IB", 0, 1))  # nfqnl_msg_config_params: 5 bytes, packed
    assert len(params) == 12 and struct.unpack("=HH", params[:4]) == (9, 2)


def test_a_delayer_that_cannot_bind_leaves_no_rule_record_or_process(testbed):
    """The node's queue is taken by another delayer: add_jitter says why the delayer did not start,
    and leaves neither its record, nor an iptables rule, nor a process."""
    tb = testbed(nodes=2)
    if netem_available(tb.switch_namespace):
        pytest.skip("this kernel has sch_netem, which adds the jitter")
    if not packet_delay.iptables_available():
        pytest.skip("no iptables for the user-space delayer: apt-get install iptables")
    n0 = tb.node(0)  # node 1's jitter is held on node 0's ingress, in queue JITTER_QUEUE_BASE + 1
    queue_num = JITTER_QUEUE_BASE + 1
    squatter = subprocess.Popen(["ip", "netns", "exec", n0.namespace, sys.executable, "-c", packet_delay._RUN_MAIN,
                                 "--queue-num", str(queue_num), "--delay-ms", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == READY_LINE
        with pytest.raises(TestbedError, match=rf"(?s)did not start.*NFQUEUE {queue_num}: Operation not permitted"):
            add_jitter(tb, 1, 50)
        assert not link_faults.jitter_record(tb, 1).exists()
        assert packet_delay.delayer_rules(n0.namespace) == []
        assert squatter.poll() is None  # another's delayer, not recorded: left alone
        assert [pid for pid in pids_in_netns(n0.namespace) if pid != squatter.pid and _is_delayer(pid)] == []
    finally:
        squatter.terminate()
        squatter.wait(10)
