"""The unit processes of a local deployment: naming, spawning, the start-up handshake, cleanup.

`LocalRuntime` owns the handles; this module holds the steps it takes on them.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from disaggsdk.launch import messages as ch
from disaggsdk.launch.channel import ChannelClosed, FrameChannel
from disaggsdk.launch.messages import UnitArgs
from disaggsdk.launch.tiny import LaunchError
from disaggsdk.transfer.shm_files import remove_fabric_shm

LOG_TAIL_LINES = 30


@dataclass
class UnitHandle:
    """The launcher's view of one unit process."""

    args: UnitArgs
    process: Any
    channel: FrameChannel  # the launcher's end of the unit's socket
    info: Any = None  # UnitInfo, once Ready
    healthy: bool = True
    started: bool = False
    fatal: str | None = None
    exit_report: str | None = None


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a unit's log."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def unit_log_tail(u: UnitHandle) -> str:
    """The last lines of a unit's log, read where the unit runs: a unit on another machine (Ray)
    hands its tail over through its process handle, whose ``log_tail`` reads it on that node."""
    remote = getattr(u.process, "log_tail", None)
    return remote(u.args.log_path) if remote is not None else log_tail(u.args.log_path)


def unit_names(plan: Any) -> list[tuple[str, Any]]:
    """(unit name, instance) for every unit of a plan: one per instance, or per dp group."""
    out = []
    for inst in plan.instances:
        for dp in range(inst.dp):
            out.append((inst.name if inst.dp == 1 else f"{inst.name}.dp{dp}", inst))
    return out


def core_sets(cpu_affinity: Any, n: int) -> list[tuple[int, ...] | None]:
    """The cores of each of ``n`` units: None, "auto" (round robin, one core each) or explicit.

    Raises:
        LaunchError: an explicit list of the wrong length.
    """
    if cpu_affinity is None:
        return [None] * n
    if cpu_affinity == "auto":
        cores = sorted(os.sched_getaffinity(0))
        return [(cores[i % len(cores)],) for i in range(n)]
    if len(cpu_affinity) != n:
        raise LaunchError(f"cpu_affinity lists {len(cpu_affinity)} core sets for {n} units; give one per unit")
    return [tuple(c) for c in cpu_affinity]


def spawn_unit(ctx: Any, args: UnitArgs) -> UnitHandle:
    """Start the process of one unit and send it its `UnitArgs` (the channel's first frame).

    A socket, not a Pipe: the same typed frames would cross TCP to another machine; the only
    thing "spawn" pickles is the socket's descriptor.
    """
    from disaggsdk.launch.unit import unit_main

    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    proc = ctx.Process(target=unit_main, args=(child,), name=f"disaggsdk-{args.name}")
    proc.start()
    child.close()
    handle = UnitHandle(args, proc, FrameChannel(parent, ch.FROM_UNIT))
    handle.channel.send(args)
    return handle


class ProcessLauncher:
    """Starts units as child processes of this one ("spawn"): `LocalRuntime`'s default launcher.

    A launcher's contract: ``spawn(args)`` returns a `UnitHandle` whose channel is connected and
    whose unit has its `UnitArgs`; ``placement_lines()`` says where units run; ``close()`` frees
    what the launcher holds, after the units stopped.
    """

    def __init__(self, ctx: Any):
        self._ctx = ctx

    def spawn(self, args: UnitArgs) -> UnitHandle:
        """Start one unit process (`spawn_unit`)."""
        return spawn_unit(self._ctx, args)

    def placement(self) -> dict[str, str]:
        """Every unit runs on this machine: nothing to say."""
        return {}

    def placement_lines(self) -> list[str]:
        return []

    def close(self) -> None:
        """Nothing held beyond the processes, which `stop_units` stops."""


def rejoin_unit(u: UnitHandle, others: list[UnitHandle], timeout_s: float) -> None:
    """The start-up handshake of a restarted unit: its `Ready`, the address book of the live
    units and itself, its `Started`.

    Raises:
        LaunchError: it died, failed or took too long (with its log tail).
    """
    deadline = time.monotonic() + timeout_s
    ready = _startup_reply(u, deadline)
    if not isinstance(ready, ch.Ready):
        raise LaunchError(f"unit {u.args.name} sent {type(ready).__name__} while restarting, expected Ready")
    u.info = ready.info
    u.channel.send(ch.Peers([o.info for o in others] + [u.info]))
    started = _startup_reply(u, deadline)
    if not isinstance(started, ch.Started):
        raise LaunchError(f"unit {u.args.name} sent {type(started).__name__} while restarting, expected Started")
    u.started = True


def start_units(units: dict[str, UnitHandle], timeout_s: float) -> None:
    """Wait for every unit's Ready, give all of them the address book, wait for every Started.

    Raises:
        LaunchError: a unit died, failed or took too long (with its log tail).
    """
    deadline = time.monotonic() + timeout_s
    for want in (ch.Ready, ch.Started):
        for name, u in units.items():
            msg = _startup_reply(u, deadline)
            if not isinstance(msg, want):
                raise LaunchError(f"unit {name} sent {type(msg).__name__} while starting, expected {want.__name__}")
            if isinstance(msg, ch.Ready):
                u.info = msg.info
            else:
                u.started = True
        if want is ch.Ready:
            peers = ch.Peers([u.info for u in units.values()])
            for u in units.values():
                u.channel.send(peers)


def _startup_reply(u: UnitHandle, deadline: float) -> Any:
    while True:
        try:
            if u.channel.poll(0.1):
                break
        except ChannelClosed:
            time.sleep(0.05)  # it closed its end: its process is exiting, as the check below finds
        if not u.process.is_alive() or time.monotonic() > deadline:
            what = "died" if not u.process.is_alive() else "did not start in time"
            raise LaunchError(f"unit {u.args.name} {what}; last lines of {u.args.log_path}:\n"
                              f"{unit_log_tail(u)}")
    msg = u.channel.recv()
    if isinstance(msg, ch.Fatal):
        u.process.join(10)
        raise LaunchError(f"unit {u.args.name} failed to start: {msg.message}\n"
                          f"last lines of {u.args.log_path}:\n{unit_log_tail(u)}")
    return msg


def stop_units(units: dict[str, UnitHandle], timeout_s: float = 15.0) -> None:
    """Ask every live unit to stop, wait, kill what is left, clean up after the killed ones."""
    for u in units.values():
        if u.process.is_alive():
            try:
                u.channel.send(ch.Shutdown())
            except ChannelClosed:
                pass
    for u in units.values():
        u.process.join(timeout_s)
        if u.process.is_alive():
            u.process.kill()
            u.process.join(5)
        if u.process.exitcode != 0:
            remove_fabric_shm(u.process.pid)
        u.channel.close()


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (a unit and its tp workers), from /proc."""
    pids, i = [pid], 0
    while i < len(pids):
        try:
            for task in os.listdir(f"/proc/{pids[i]}/task"):
                with open(f"/proc/{pids[i]}/task/{task}/children") as f:
                    pids += [int(p) for p in f.read().split()]
        except OSError:
            pass  # gone meanwhile
        i += 1
    return pids


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live descendants (Linux /proc)."""
    total_ticks = 0
    for p in _process_tree(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total_ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))
    return total_ticks / os.sysconf("SC_CLK_TCK")
