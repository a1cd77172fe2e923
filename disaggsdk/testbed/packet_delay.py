"""A user-space packet delayer: packets wait ``delay_ms ± jitter_ms`` in a process of the link, for
kernels without ``sch_netem`` (netem alone varies delay in the kernel; this one also lacks
``sch_fq``/``etf``, so no departure-time delay either).

The kernel's NFQUEUE (``nfnetlink_queue``, reached by iptables' ``-j NFQUEUE``; nftables' own
``queue`` is often not built) hands each packet to a process and holds it until the process gives
a verdict. The delayer binds a queue over raw netlink (``AF_NETLINK``, ``NETLINK_NETFILTER``; no
library), asks for metadata only (``NFQNL_COPY_META``: no payload is copied to user space), and
gives each packet's ACCEPT at ``arrival + uniform(delay - jitter, delay + jitter)``, drawn per
packet as netem draws its jitter: a packet whose draw is shorter overtakes those queued before it,
as on netem.

**Where it holds packets: on the receiving node's ingress** (``mangle PREROUTING -i eth0``,
``-s SENDER`` for what one node sends), not on the sender's egress where netem sits. A TCP sender
counts what it sent and the kernel has not yet freed against its small-queue budget (TSQ: about
two packets or a millisecond of its pacing rate); netem orphans what it holds, a queued packet
cannot be orphaned from user space, so a delay on the sender's egress caps a flow at that budget
per delay: 9 Mbit/s through a 5 ms delay at 1 Gbit/s, measured. The receiver's IP layer has
orphaned the packet before PREROUTING, so there the same delay passed 727 Mbit/s. A packet
between two nodes still meets the delay once, after the link's rate shaping rather than before.

The delayer is part of the link, not a process of a node: it runs in a node's network namespace
only (``ip netns exec``), so the node's own processes neither see nor stop it, and `down`'s sweep
of the testbed's namespaces kills it with whatever else is left. Its record, a file beside the
state file, names its pid and namespace for `stop_delayers`.

Its limits: every packet crosses to user space and back (two netlink messages and a Python loop),
and release times are those of ``select``'s timer (tens of microseconds late under load). The
queue takes GSO super-packets whole (``NFQA_CFG_F_GSO``), as netem does, so a TCP stream costs it
a packet per 64 KiB rather than per frame; docs/testbed.md has the throughput measured.

Run as a program inside a namespace (`main`: ``--queue-num N --delay-ms D --jitter-ms J``) it
binds the queue, prints ``ready`` and delays until SIGTERM, when it releases every packet it holds
at once and exits.
"""

from __future__ import annotations

import argparse
import errno
import heapq
import json
import os
import random
import select
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from disaggsdk.testbed.errors import TestbedError
from disaggsdk.testbed.state import DelayerState
from disaggsdk.testbed.tools import COMMAND_TIMEOUT_S, process_runs, run_tool, try_tool

READY_LINE = "ready"
READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
RULE_COMMENT = "disaggsdk-delay"  # marks the delayer's iptables rules: ``disaggsdk-delay-qN`` for queue N
IPTABLES = "iptables"
_MODULE = "disaggsdk.testbed.packet_delay"
# the program's command line: `-m` would run this module a second time beside the copy that
# importing the package (`disaggsdk.testbed` imports it) already made; the name stays in the
# command line, which is how `delayer_runs` tells a recorded pid is still a delayer
_RUN_MAIN = f"import sys; from {_MODULE} import main; sys.exit(main())"
_INSTALL_IPTABLES = "install iptables (apt-get install iptables)"

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


@dataclass(frozen=True)
class Delayer:
    """One delayer process on one node's ingress, as its record says.

    Attributes:
        pid: its process, as the host numbers it.
        namespace: the receiving node's network namespace, where it and its rule are.
        interface: the node's end of its link, whose ingress it holds.
        queue_num: the NFQUEUE it binds (queues are per network namespace).
        source: the IPv4 address whose packets it holds; None: every packet the interface receives.
        delay_ms: the mean delay it adds, milliseconds.
        jitter_ms: how far each packet's delay is drawn either side of ``delay_ms``, milliseconds.
    """

    pid: int
    namespace: str
    interface: str
    queue_num: int
    source: str | None
    delay_ms: float
    jitter_ms: float

    def to_dict(self) -> DelayerState:
        """The fields as JSON values (the record)."""
        return {"pid": self.pid, "namespace": self.namespace, "interface": self.interface,
                "queue_num": self.queue_num, "source": self.source, "delay_ms": self.delay_ms,
                "jitter_ms": self.jitter_ms}

    @classmethod
    def from_dict(cls, data: DelayerState) -> Delayer:
        """The inverse of `to_dict`."""
        return cls(pid=int(data["pid"]), namespace=str(data["namespace"]), interface=str(data["interface"]),
                   queue_num=int(data["queue_num"]), source=None if data["source"] is None else str(data["source"]),
                   delay_ms=float(data["delay_ms"]), jitter_ms=float(data["jitter_ms"]))


def record_path(state_dir: Path, node_name: str, purpose: str) -> Path:
    """Where the delayers of node ``node_name`` (``NAME-nK``) for ``purpose`` (``jitter``: a fault
    on what it sends; ``link``: its link's own delay, on what it receives) are recorded."""
    return state_dir / f"{node_name}.{purpose}.delayers.json"


def records_of(state_dir: Path, testbed_name: str) -> list[Path]:
    """Every delayer record of testbed ``testbed_name`` (a name has no ``-``, so no other testbed's match)."""
    return sorted(state_dir.glob(f"{testbed_name}-n*.delayers.json"))


def iptables_available() -> bool:
    """Whether the ``iptables`` command, which puts packets into a delayer's queue, is here."""
    return shutil.which(IPTABLES) is not None


def read_delayers(record: Path) -> list[Delayer]:
    """The delayers ``record`` names; empty where there is no record (or an unreadable one)."""
    try:
        return [Delayer.from_dict(entry) for entry in json.loads(record.read_text(encoding="utf-8"))]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def start_delayers(holders: Sequence[tuple[str, str]], source: str | None, queue_num: int, delay_ms: float,
                   jitter_ms: float, max_queued_packets: int, record: Path) -> list[Delayer]:
    """Delay packets on the ingress of each of ``holders``, in place of the delayers ``record``
    names; nothing is left behind if a step fails.

    A delayer with a ``source`` is put ahead of those without on its node's path: a packet takes
    the first delayer it meets (an ACCEPT moves it past the rest of the chain), so a jitter on one
    sender's packets stands in for the link's own delay for them, as netem's jitter does.

    Args:
        holders: (network namespace, interface) of each receiving node.
        source: the sender whose packets are delayed; None: every packet the holders receive.
        queue_num: the NFQUEUE, per namespace; one number per purpose and sender.
        delay_ms: the mean delay, milliseconds (at least ``jitter_ms``).
        jitter_ms: each packet's delay is uniform in ``delay_ms ± jitter_ms``; 0 delays every packet alike.
        max_queued_packets: packets a queue holds before it drops (as netem's ``limit``).
        record: where they are recorded for `stop_delayers`.

    Returns:
        the delayers, running and on the packets' path.

    Raises:
        ValueError: a negative delay or jitter, or a jitter above the delay.
        TestbedError: ``iptables`` is missing, a delayer did not start (its message), or a rule was refused.
    """
    if not 0 <= jitter_ms <= delay_ms:
        raise ValueError(f"delay {delay_ms:g} ms ± {jitter_ms:g} ms: give 0 <= jitter <= delay")
    if not iptables_available():
        raise TestbedError(f"a delay without sch_netem queues packets with iptables' NFQUEUE, and the `{IPTABLES}` "
                           f"command is missing: {_INSTALL_IPTABLES}")
    stop_delayers(record)
    started: list[Delayer] = []
    try:
        for namespace, interface in holders:
            started.append(_start_one(namespace, interface, source, queue_num, delay_ms, jitter_ms,
                                      max_queued_packets, lambda delayer: _write_record(record, [*started, delayer])))
    except BaseException:
        stop_delayers(record)
        raise
    return started


def stop_delayers(record: Path, remove_rules: bool = True) -> bool:
    """Take the delayers ``record`` names off the path and stop them: their rules go first, then
    each releases what it holds and exits (killed if it does not), then the record. Safe to call
    where there is none.

    Args:
        record: their record (`record_path`).
        remove_rules: False where their namespaces are about to be deleted, and the rules with them (`down`).

    Returns:
        whether there was a delayer recorded.

    Raises:
        TestbedError: a rule could not be removed (the message holds iptables' words).
    """
    delayers = read_delayers(record)
    for delayer in delayers:
        if remove_rules and Path(f"/run/netns/{delayer.namespace}").exists():
            _remove_rules(delayer.namespace, delayer.queue_num)
        _stop_process(delayer)
    record.unlink(missing_ok=True)
    return bool(delayers)


def delayer_rules(namespace: str) -> list[str]:
    """Every delayer's iptables rule in ``namespace`` as ``iptables -S`` writes it, in path order (empty: none)."""
    listed = run_tool(["ip", "netns", "exec", namespace, IPTABLES, "-w", "-t", "mangle", "-S", "PREROUTING"])
    return [line for line in listed.splitlines() if RULE_COMMENT in line]


def delayer_runs(delayer: Delayer) -> bool:
    """Whether ``delayer``'s process still runs in its namespace (a recycled pid does not count)."""
    try:
        with open(f"/proc/{delayer.pid}/cmdline", "rb") as f:
            cmdline = f.read()
        in_namespace = os.stat(f"/proc/{delayer.pid}/ns/net").st_ino == \
            os.stat(f"/run/netns/{delayer.namespace}").st_ino
    except OSError:
        return False
    return in_namespace and _MODULE.encode() in cmdline and process_runs(delayer.pid)


def _start_one(namespace: str, interface: str, source: str | None, queue_num: int, delay_ms: float,
               jitter_ms: float, max_queued_packets: int, record: Callable[[Delayer], None]) -> Delayer:
    argv = ["ip", "netns", "exec", namespace, sys.executable, "-c", _RUN_MAIN, "--queue-num", str(queue_num),
            "--delay-ms", repr(delay_ms), "--jitter-ms", repr(jitter_ms), "--max-queued-packets",
            str(max_queued_packets)]
    # its own session: a Ctrl-C in the terminal that added the delay does not reach it
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    delayer = Delayer(pid=proc.pid, namespace=namespace, interface=interface, queue_num=queue_num, source=source,
                      delay_ms=delay_ms, jitter_ms=jitter_ms)
    try:
        record(delayer)  # before anything else can fail, so the caller's stop finds it
        _wait_ready(proc)
        # a sender's delayer ahead of the link's own (see `start_delayers`)
        _iptables(namespace, ["-I", "PREROUTING", "1", *_rule(delayer)[1:]] if source else ["-A", *_rule(delayer)])
    finally:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
        # it outlives this Popen on purpose (until `stop_delayers` or `down`): marked done, Popen
        # neither warns that it still runs nor reaps it behind `stop_delayers`' back
        proc.returncode = 0
    return delayer


def _rule(delayer: Delayer) -> list[str]:
    # --queue-bypass: while no delayer is bound to the queue (a crashed one), packets pass undelayed
    # instead of being dropped; a link that loses its delay is a smaller surprise than a dead one
    source = ["-s", delayer.source] if delayer.source else []
    return ["PREROUTING", "-i", delayer.interface, *source, "-m", "comment", "--comment", _comment(delayer.queue_num),
            "-j", "NFQUEUE", "--queue-num", str(delayer.queue_num), "--queue-bypass"]


def _comment(queue_num: int) -> str:
    return f"{RULE_COMMENT}-q{queue_num}"


def _iptables(namespace: str, args: list[str]) -> None:
    run_tool(["ip", "netns", "exec", namespace, IPTABLES, "-w", "-t", "mangle", *args])


def _remove_rules(namespace: str, queue_num: int) -> None:
    if not iptables_available():
        return  # nothing could have added one
    for line in delayer_rules(namespace):
        words = shlex.split(line)
        if _comment(queue_num) in words:
            _iptables(namespace, ["-D", *words[1:]])  # "-A PREROUTING ..." deleted as written
    _remove_empty_mangle_table(namespace)


def _remove_empty_mangle_table(namespace: str) -> None:
    # iptables-nft keeps an emptied table as an nftables table (`nft list tables` shows `ip mangle`):
    # where the rules were the delayers' alone, the table goes too, so a heal leaves the namespace as
    # it found it. iptables-legacy's tables are not nftables' and are left (they hold no rule).
    if "nf_tables" not in run_tool([IPTABLES, "--version"]) or shutil.which("nft") is None:
        return
    listed = run_tool(["ip", "netns", "exec", namespace, IPTABLES, "-w", "-t", "mangle", "-S"])
    if all(line.startswith("-P ") and line.endswith(" ACCEPT") for line in listed.splitlines()):
        try_tool(["ip", "netns", "exec", namespace, "nft", "delete", "table", "ip", "mangle"])


def _stop_process(delayer: Delayer) -> None:
    if delayer_runs(delayer):
        try:
            os.kill(delayer.pid, signal.SIGTERM)  # it releases what it holds and exits
        except ProcessLookupError:
            pass
        if _wait_gone(delayer.pid, STOP_TIMEOUT_S):
            try:
                os.kill(delayer.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            _wait_gone(delayer.pid, STOP_TIMEOUT_S)
    else:
        _wait_gone(delayer.pid, 0.0)  # reap it where it died as this process's child


def _wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait until ``pid`` has exited, reaping it where it is this process's child; True if it still runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return False
        except ChildProcessError:
            pass  # not our child (another process started it): its parent or init reaps it
        if not process_runs(pid):
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.02)


def _write_record(record: Path, delayers: list[Delayer]) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    partial = record.with_suffix(".json.partial")
    partial.write_text(json.dumps([delayer.to_dict() for delayer in delayers], indent=2) + "\n", encoding="utf-8")
    os.replace(partial, record)


def _wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None and proc.stderr is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
    line = proc.stdout.readline().strip() if ready else ""
    if line != READY_LINE:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        raise TestbedError("the packet delayer did not start" + (f" in {READY_TIMEOUT_S:g} s" if not ready else "")
                           + f": {err.strip()[-2000:] or 'no message'}")


# the delayer itself (runs inside the node's network namespace)


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
