"""A user-space packet delayer: packets wait ``delay_ms ± jitter_ms`` in a process of the link, for
kernels without ``sch_netem`` (netem alone varies delay in the kernel; this one also lacks
``sch_fq``/``etf``, so no departure-time delay either).
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from disaggsdk.testbed.errors import TestbedError
from disaggsdk.testbed.nfqueue_delayer import READY_LINE
from disaggsdk.testbed.state import DelayerState
from disaggsdk.testbed.tools import COMMAND_TIMEOUT_S, process_runs, run_tool, try_tool

READY_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
RULE_COMMENT = "disaggsdk-delay"  # marks the delayer's iptables rules: ``disaggsdk-delay-qN`` for queue N
IPTABLES = "iptables"
_MODULE = "disaggsdk.testbed.nfqueue_delayer"
# the program's command line: `-m` would run this module a second time beside the copy that
# importing the package (`disaggsdk.testbed` imports it) already made; the name stays in the
# command line, which is how `delayer_runs` tells a recorded pid is still a delayer
_RUN_MAIN = f"import sys; from {_MODULE} import main; sys.exit(main())"
_INSTALL_IPTABLES = "install iptables (apt-get install iptables)"



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
