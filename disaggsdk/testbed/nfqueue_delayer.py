"""The user-space packet delayer itself, the process `packet_delay` starts in a node's network
namespace: packets wait ``delay_ms ± jitter_ms`` in it, for kernels without ``sch_netem``.
"""

from __future__ import annotations

import argparse
import errno
import heapq
import os
import random
import select
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator

READY_LINE = "ready"  # what the program prints once its queue is bound

# netlink and nfnetlink_queue (linux/netlink.h, linux/netfilter/nfnetlink.h, nfnetlink_queue.h)
NETLINK_NETFILTER = 12
_SOL_NETLINK = 270
_NETLINK_NO_ENOBUFS = 5
_SO_RCVBUFFORCE = 33
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 0x1
_NLM_F_ACK = 0x4
_NFNL_SUBSYS_QUEUE = 3
_NFQNL_MSG_PACKET = _NFNL_SUBSYS_QUEUE << 8 | 0
_NFQNL_MSG_VERDICT = _NFNL_SUBSYS_QUEUE << 8 | 1
_NFQNL_MSG_CONFIG = _NFNL_SUBSYS_QUEUE << 8 | 2
_NFQNL_CFG_CMD_BIND = 1
_NFQA_CFG_CMD = 1
_NFQA_CFG_PARAMS = 2
_NFQA_CFG_QUEUE_MAXLEN = 3
_NFQA_CFG_MASK = 4
_NFQA_CFG_FLAGS = 5
_NFQNL_COPY_META = 1
_NFQA_CFG_F_FAIL_OPEN = 0x1
_NFQA_CFG_F_GSO = 0x4
_NFQA_PACKET_HDR = 1
_NFQA_VERDICT_HDR = 2
_NLA_TYPE_MASK = 0x3FFF  # an attribute's type without the nested / byte-order flags
_NF_ACCEPT = 1
_NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, sequence, port id
_NFGENMSG = struct.Struct("!BBH")  # family, version, queue number (big-endian)
_NLA_HEADER = struct.Struct("=HH")  # length, type
_RECEIVE_BUFFER_BYTES = 8 << 20  # the socket's: packets wait here for the loop; a full one loses them
_VERDICTS_PER_SEND = 1024  # 32 KiB of verdict messages in one send


class NfQueue:
    """One NFQUEUE queue bound over netlink: packets' ids in, ACCEPT verdicts out.

    Args:
        queue_num: the queue (``iptables -j NFQUEUE --queue-num``).
        max_queued_packets: how many packets the kernel holds for it before it drops.

    Raises:
        OSError: the kernel refused the bind (no nfnetlink_queue, the queue taken, not root).
    """

    def __init__(self, queue_num: int, max_queued_packets: int) -> None:
        self.queue_num = queue_num
        self._sequence = 0
        self._buffer = bytearray(1 << 16)
        self._socket = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, _RECEIVE_BUFFER_BYTES)
            self._socket.setsockopt(_SOL_NETLINK, _NETLINK_NO_ENOBUFS, 1)
            self._socket.bind((0, 0))
            self._bind(max_queued_packets)
            self._socket.setblocking(False)
        except BaseException:
            self._socket.close()
            raise

    def fileno(self) -> int:
        """The netlink socket, readable when packets wait."""
        return self._socket.fileno()

    def close(self) -> None:
        """Unbind: the kernel drops whatever still waits for a verdict (give them first)."""
        self._socket.close()

    def __enter__(self) -> NfQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def receive(self) -> Iterator[int]:
        """The ids of the packets queued since the last call, in arrival order (never blocks)."""
        while True:
            try:
                size = self._socket.recv_into(self._buffer)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    continue  # messages were lost: the kernel dropped those packets
                raise
            yield from _packet_ids(memoryview(self._buffer)[:size])

    def accept(self, packet_ids: list[int]) -> None:
        """Give ``packet_ids`` their ACCEPT: they go on through the stack, in this order."""
        for start in range(0, len(packet_ids), _VERDICTS_PER_SEND):
            messages = b"".join(self._verdict(packet_id) for packet_id in packet_ids[start:start + _VERDICTS_PER_SEND])
            self._socket.send(messages)

    def _message(self, kind: int, flags: int, attributes: bytes) -> bytes:
        self._sequence += 1
        body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, self.queue_num) + attributes
        return _NLMSG_HEADER.pack(_NLMSG_HEADER.size + len(body), kind, flags, self._sequence, 0) + body

    def _verdict(self, packet_id: int) -> bytes:
        return self._message(_NFQNL_MSG_VERDICT, _NLM_F_REQUEST,
                             _attribute(_NFQA_VERDICT_HDR, struct.pack("!II", _NF_ACCEPT, packet_id)))

    def _bind(self, max_queued_packets: int) -> None:
        # no NFQA_CFG_F_FAIL_OPEN: a full queue drops, as netem's does at its limit, so the faults
        # stay faults; fail-open would send the overflow on undelayed, a link that quietly loses
        # its delay under load. NFQA_CFG_F_GSO: a GSO super-packet is queued whole, as netem
        # holds it, rather than cut into frames in software first.
        flags = _NFQA_CFG_F_GSO
        attributes = (_attribute(_NFQA_CFG_CMD, struct.pack("!BxH", _NFQNL_CFG_CMD_BIND, socket.AF_INET))
                      + _attribute(_NFQA_CFG_PARAMS, struct.pack("!IB", 0, _NFQNL_COPY_META))
                      + _attribute(_NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", max_queued_packets))
                      + _attribute(_NFQA_CFG_MASK, struct.pack("!I", _NFQA_CFG_F_FAIL_OPEN | _NFQA_CFG_F_GSO))
                      + _attribute(_NFQA_CFG_FLAGS, struct.pack("!I", flags)))
        self._socket.send(self._message(_NFQNL_MSG_CONFIG, _NLM_F_REQUEST | _NLM_F_ACK, attributes))
        size = self._socket.recv_into(self._buffer)
        length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(self._buffer, 0)
        if kind != _NLMSG_ERROR or size < _NLMSG_HEADER.size + 4:
            raise OSError(errno.EPROTO, f"nfnetlink_queue answered the bind with message type {kind}")
        (error,) = struct.unpack_from("=i", self._buffer, _NLMSG_HEADER.size)
        if error:
            raise OSError(-error, f"binding NFQUEUE {self.queue_num}: {os.strerror(-error)}")


def _attribute(kind: int, payload: bytes) -> bytes:
    length = _NLA_HEADER.size + len(payload)
    return _NLA_HEADER.pack(length, kind) + payload + b"\0" * (-length % 4)


def _packet_ids(data: memoryview) -> Iterator[int]:
    offset = 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, kind, _, _, _ = _NLMSG_HEADER.unpack_from(data, offset)
        if length < _NLMSG_HEADER.size:
            return
        if kind == _NFQNL_MSG_PACKET:
            attribute = offset + _NLMSG_HEADER.size + _NFGENMSG.size
            while attribute + _NLA_HEADER.size <= offset + length:
                size, attribute_kind = _NLA_HEADER.unpack_from(data, attribute)
                if size < _NLA_HEADER.size:
                    break
                if attribute_kind & _NLA_TYPE_MASK == _NFQA_PACKET_HDR:
                    yield struct.unpack_from("!I", data, attribute + _NLA_HEADER.size)[0]
                    break
                attribute += (size + 3) & ~3
        offset += (length + 3) & ~3


def run_delayer(queue: NfQueue, delay_ms: float, jitter_ms: float, rng: random.Random, stop_fd: int,
                on_ready: Callable[[], None] = lambda: None) -> int:
    """Delay every packet of ``queue`` by a draw of ``uniform(delay_ms - jitter_ms, delay_ms + jitter_ms)``
    until ``stop_fd`` is readable, then release those still held at once.

    Args:
        queue: the bound queue.
        delay_ms: the mean delay, milliseconds.
        jitter_ms: the spread either side, milliseconds (``<= delay_ms``).
        rng: the draws' source.
        stop_fd: a descriptor that becomes readable when the delayer is to stop (a signal's wakeup pipe).
        on_ready: called once before the first packet is awaited.

    Returns:
        how many packets it delayed.
    """
    low_s, high_s = (delay_ms - jitter_ms) / 1e3, (delay_ms + jitter_ms) / 1e3
    held: list[tuple[float, int]] = []  # (release time, packet id), earliest first
    delayed = 0
    on_ready()
    while True:
        timeout_s = max(0.0, held[0][0] - time.monotonic()) if held else None
        readable, _, _ = select.select([queue.fileno(), stop_fd], [], [], timeout_s)
        if stop_fd in readable:
            break
        if readable:
            arrived_s = time.monotonic()
            for packet_id in queue.receive():
                heapq.heappush(held, (arrived_s + rng.uniform(low_s, high_s), packet_id))
                delayed += 1
        now_s = time.monotonic()
        due = []
        while held and held[0][0] <= now_s:
            due.append(heapq.heappop(held)[1])
        if due:
            queue.accept(due)
    # stopping: what it holds goes on now; closing the queue with packets in it would drop them
    queue.accept([packet_id for _, packet_id in sorted(held)])
    return delayed


def main(argv: list[str] | None = None) -> int:
    """The delayer as a program: bind, print ``ready``, delay until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="packet_delay", description="Delay every packet of an NFQUEUE queue.")
    parser.add_argument("--queue-num", type=int, required=True)
    parser.add_argument("--delay-ms", type=float, required=True)
    parser.add_argument("--jitter-ms", type=float, default=0.0)
    parser.add_argument("--max-queued-packets", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    if not 0 <= args.jitter_ms <= args.delay_ms:
        parser.error("give 0 <= --jitter-ms <= --delay-ms")
    stop_read, stop_write = os.pipe()
    os.set_blocking(stop_write, False)
    signal.set_wakeup_fd(stop_write)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: None)  # the wakeup pipe, not the handler, ends the loop

    def ready() -> None:
        print(READY_LINE, flush=True)
        # nobody reads its output after this: writing to a closed pipe must not end it
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        os.close(quiet)

    try:
        queue = NfQueue(args.queue_num, args.max_queued_packets)
    except OSError as exc:
        print(f"packet delayer: {exc} (no nfnetlink_queue in the kernel, another process holds the queue, "
              "or not root)", file=sys.stderr)
        return 1
    with queue:
        run_delayer(queue, args.delay_ms, args.jitter_ms, random.Random(args.seed), stop_read, on_ready=ready)
    return 0


if __name__ == "__main__":
    sys.exit(main())
