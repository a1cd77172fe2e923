"""The units of a deployment: naming, local processes (`ProcessLauncher`), the start-up handshake, cleanup.

The runtime (`launch.launcher.supervisor.Supervisor`) owns the handles; this module holds the steps it takes on them.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait as wait_any
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Literal, overload

import msgspec

from disaggsdk.engine.group_address import free_loopback_address
from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import ChannelClosed, LaunchError, UnitCannotRun, UnitHandle
from disaggsdk.launch.channel import FrameChannel
from disaggsdk.launch.messages import UnitArgs
from disaggsdk.launch.progress import ProgressListener, progress_line
from disaggsdk.transfer.shm_files import remove_fabric_shm

if TYPE_CHECKING:
    from disaggsdk.messenger.peers import UnitInfo
    from disaggsdk.plan import Instance, Plan
    from disaggsdk.spec.types import Spec

LOG_TAIL_LINES = 30

# which cores each unit may use: None (any), "auto" (unit i on core i mod cores), or one core set per unit
CpuAffinity = Literal["auto"] | Sequence[Sequence[int]] | None


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a unit's log."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def unit_log_tail(u: UnitHandle) -> str:
    """The last lines of a unit's log, read where the unit runs (a unit on another machine: by its
    process handle, on that node)."""
    return u.process.log_tail(u.args.log_path)


def unit_names(plan: Plan) -> list[tuple[str, Instance]]:
    """(unit name, instance) for every unit of a plan: one per instance, or per dp group."""
    out = []
    for inst in plan.instances:
        for dp in range(inst.dp):
            out.append((inst.name if inst.dp == 1 else f"{inst.name}.dp{dp}", inst))
    return out


def dp_group_addresses(spec: Spec, plan: Plan) -> dict[str, str]:
    """Instance name -> "127.0.0.1:port" where its dp ranks meet, for each instance whose routed
    experts span its dp ranks (``ep > 1`` and ``dp > 1``: one lock-step group, engine.dp_lockstep).

    Loopback: an instance's ranks share a node (the plan never splits one), and the group's store
    is served by its first rank's process. The port is free now; the first rank binds it when it
    starts, moments later.
    """
    return {inst.name: free_loopback_address() for inst in plan.instances
            if inst.dp > 1 and spec.roles[inst.role].ep > 1}


def core_sets(cpu_affinity: CpuAffinity, n: int) -> list[tuple[int, ...] | None]:
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


class LocalUnitProcess:
    """A unit's child process on this machine (a `base.UnitProcess`)."""

    def __init__(self, process: BaseProcess):
        self._process = process

    @property
    def pid(self) -> int:
        pid = self._process.pid
        return -1 if pid is None else pid

    @property
    def sentinel(self) -> int:
        return self._process.sentinel

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._process.join(timeout)

    def kill(self) -> None:
        self._process.kill()

    def log_tail(self, path: str) -> str:
        """The log is on this machine: read it here."""
        return log_tail(path)


class ProcessLauncher:
    """Starts units as child processes of this one ("spawn"): the default `base.Launcher`.

    A socket, not a Pipe, carries each unit's channel: the same typed frames would cross TCP to
    another machine; the only thing "spawn" pickles is the socket's descriptor.
    """

    def __init__(self) -> None:
        self._ctx = mp.get_context("spawn")
        # `device: cuda`: CUDA_VISIBLE_DEVICES of each unit by (instance, dp rank) (`launch.cuda_devices`)
        self._visible_devices: dict[tuple[str, int], str] = {}

    def provider_for(self, plan: Plan, provider: str) -> str:
        """Every unit is on this machine: the provider asked for."""
        return provider

    def start(self, plan: Plan) -> None:
        """Refuse a launch from a script's unguarded top level, which every "spawn" child would run
        again (`main_guard`); for a `device: cuda` plan, give each unit its devices
        (`cuda_devices`), refusing one that needs more than this machine has. A machine without
        CUDA is not refused here: its units start and each says so at its first CUDA call.

        Raises:
            LaunchError: the launch is not under ``if __name__ == "__main__":`` in the main script;
                ranks that share a device do not fit it; fewer devices than the plan places ranks on.
        """
        from disaggsdk.launch.launcher.main_guard import check_main_guarded

        check_main_guarded()
        if plan.spec.device != "cuda":
            return
        from disaggsdk.launch.cuda_devices import (
            VISIBLE_DEVICES_ENV,
            check_device_count,
            check_shared_memory,
            unit_visible_devices,
        )

        check_shared_memory(plan)
        num_devices = _cuda_device_count()
        if num_devices:
            check_device_count(plan, num_devices)
        self._visible_devices = unit_visible_devices(plan, os.environ.get(VISIBLE_DEVICES_ENV))

    def spawn(self, args: UnitArgs) -> UnitHandle:
        """Start the process of one unit and send it its `UnitArgs` (the channel's first frame)."""
        from disaggsdk.launch.unit_process.unit import unit_main

        devices = self._visible_devices.get((args.instance, args.dp_rank))
        if devices is not None:
            args = msgspec.structs.replace(args, cuda_visible_devices=devices)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        proc = self._ctx.Process(target=unit_main, args=(child,), name=f"disaggsdk-{args.name}")
        proc.start()
        child.close()
        handle = UnitHandle(args, LocalUnitProcess(proc), FrameChannel(parent, ch.FROM_UNIT))
        handle.channel.send(args)
        return handle

    def placement(self) -> dict[str, str]:
        """Every unit runs on this machine: nothing to say."""
        return {}

    def close(self) -> None:
        """Nothing held beyond the processes, which `stop_units` stops."""


def _cuda_device_count() -> int:
    """The CUDA devices this launcher sees; 0 without CUDA (or without torch, which a unit needs anyway)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rejoin_unit(u: UnitHandle, others: list[UnitHandle], timeout_s: float,
                on_progress: ProgressListener | None = None) -> UnitInfo:
    """The start-up handshake of a restarted unit: its `Ready`, the address book of the live
    units and itself, its `Started`. ``on_progress`` gets a line per start-up step (`progress_line`).

    Returns:
        How the others see it now (its new incarnation).

    Raises:
        LaunchError: it died, failed or took too long (with its log tail).
    """
    deadline = time.monotonic() + timeout_s
    ready = _next_reply(u, deadline, on_progress)
    if not isinstance(ready, ch.Ready):
        raise LaunchError(f"unit {u.args.name} sent {type(ready).__name__} while restarting, expected Ready")
    u.info = ready.info
    u.channel.send(ch.Peers([o.info for o in others if o.info is not None] + [ready.info]))
    started = _next_reply(u, deadline, on_progress)
    if not isinstance(started, ch.Started):
        raise LaunchError(f"unit {u.args.name} sent {type(started).__name__} while restarting, expected Started")
    u.started = True
    return ready.info


def start_units(units: dict[str, UnitHandle], timeout_s: float, on_progress: ProgressListener | None = None) -> None:
    """Wait for every unit's Ready, give all of them the address book, wait for every Started.

    Every unit is listened to at once, so that each one's start-up steps reach ``on_progress`` as they
    happen (`progress_line`, then ``<unit>: ready after S s`` at its `Ready`).

    Raises:
        LaunchError: a unit died, failed or took too long (with its log tail).
    """
    start_s = time.monotonic()
    deadline = start_s + timeout_s
    say = on_progress or (lambda _line: None)
    ready = _replies_of_all(units, deadline, on_progress, lambda name: say(
        f"{name}: ready after {time.monotonic() - start_s:.1f} s"))
    infos: list[UnitInfo] = []
    for name, u in units.items():
        msg = ready[name]
        if not isinstance(msg, ch.Ready):
            raise LaunchError(f"unit {name} sent {type(msg).__name__} while starting, expected Ready")
        u.info = msg.info
        infos.append(msg.info)
    peers = ch.Peers(infos)
    for u in units.values():
        u.channel.send(peers)
    started = _replies_of_all(units, deadline, on_progress, lambda _name: None)
    for name, u in units.items():
        if not isinstance(started[name], ch.Started):
            raise LaunchError(f"unit {name} sent {type(started[name]).__name__} while starting, expected Started")
        u.started = True


def _replies_of_all(units: dict[str, UnitHandle], deadline: float, on_progress: ProgressListener | None,
                    on_reply: Callable[[str], None]) -> dict[str, ch.FromUnit]:
    """The next reply (not `Progress`) of every unit, whichever speaks first; ``on_reply(name)`` at each."""
    replies: dict[str, ch.FromUnit] = {}
    while len(replies) < len(units):
        waiting = [u for name, u in units.items() if name not in replies]
        try:
            wait_any([u.channel.fileno() for u in waiting], timeout=0.1)
        except (OSError, ValueError):
            pass  # a channel closed under us: polling it below says why
        for u in waiting:
            msg = _next_reply(u, deadline, on_progress, wait_s=0.0)
            if msg is not None:
                replies[u.args.name] = msg
                on_reply(u.args.name)
    return replies


@overload
def _next_reply(u: UnitHandle, deadline: float, on_progress: ProgressListener | None) -> ch.FromUnit: ...
@overload
def _next_reply(u: UnitHandle, deadline: float, on_progress: ProgressListener | None,
                wait_s: float) -> ch.FromUnit | None: ...
def _next_reply(u: UnitHandle, deadline: float, on_progress: ProgressListener | None,
                wait_s: float | None = None) -> ch.FromUnit | None:
    """``u``'s next start-up reply, handing its `Progress` frames to ``on_progress`` on the way.

    Args:
        wait_s: how long to wait for it; None: until ``deadline`` (then it never returns None).
    Raises:
        LaunchError: it died, failed (`Fatal`) or passed ``deadline`` (with its log tail).
    """
    until = deadline if wait_s is None else time.monotonic() + wait_s
    while True:
        try:
            if u.channel.poll(min(0.1, max(0.0, until - time.monotonic()))):
                msg = u.channel.recv()
                if isinstance(msg, ch.Progress):
                    if msg.stage != "loading":
                        u.compile_stage = msg.stage
                    if on_progress is not None:
                        on_progress(progress_line(msg))
                    continue
                break
        except ChannelClosed:
            time.sleep(0.05)  # it closed its end: its process is exiting, as the check below finds
        if not u.process.is_alive() or time.monotonic() > deadline:
            what = "died" if not u.process.is_alive() else "did not start in time"
            raise LaunchError(f"unit {u.args.name} {what}; last lines of {u.args.log_path}:\n"
                              f"{unit_log_tail(u)}")
        if time.monotonic() >= until:
            return None
    if isinstance(msg, ch.Fatal):
        u.process.join(10)
        if msg.cannot_run:  # the whole report, for the user: its log has only the same line
            raise UnitCannotRun(msg.message)
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
