"""One node of a testbed: a network namespace with its link, and an anchor process that holds the
node's own mount, UTS, IPC and pid namespaces, which every command run in the node enters.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from disaggsdk.testbed.errors import TestbedError
from disaggsdk.testbed.state import NodeState
from disaggsdk.testbed.tools import process_runs, run_tool

ANCHOR_READY_TIMEOUT_S = 15.0
ANCHOR_READY_LINE = "ready"
# the anchor, pid 1 of the node: reaps every child it is given (SIGCHLD waited for, never polled)
_REAPER = ("import os, signal\n"
           "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})\n"
           "while True:\n"
           "    signal.sigwait({signal.SIGCHLD})\n"
           "    try:\n"
           "        while os.waitpid(-1, os.WNOHANG)[0]:\n"
           "            pass\n"
           "    except ChildProcessError:\n"
           "        pass\n")
# run by the anchor before it becomes the reaper: $1 the hostname, $2 the Python that reaps, $3 its
# code, then the host paths under /tmp the node must see (`host_paths_under_tmp`): each is bound to a
# mount point in the node's new /dev/shm before /tmp is replaced, then moved to its own path in the
# node's /tmp, so the node sees those folders of the host and nothing else of the host's /tmp
_ANCHOR_SETUP = (
    'set -e; name=$1; python=$2; reaper=$3; shift 3; '
    'mount -t tmpfs -o mode=1777 tmpfs /dev/shm; '
    'i=0; for p in "$@"; do mkdir /dev/shm/.host$i; mount --bind "$p" /dev/shm/.host$i; i=$((i+1)); done; '
    'mount -t tmpfs -o mode=1777 tmpfs /tmp; '
    'i=0; for p in "$@"; do mkdir -p "$p"; mount --move /dev/shm/.host$i "$p"; rmdir /dev/shm/.host$i; i=$((i+1)); done; '
    # a Python the node cannot see (a venv under a /tmp folder not bound) would end the anchor after "ready"
    'test -x "$python" || { echo "$python is not in the node (not under a folder it binds)" >&2; exit 1; }; '
    f'hostname "$name"; echo {ANCHOR_READY_LINE}; exec "$python" -I -S -c "$reaper" </dev/null >/dev/null 2>&1')
SHARED_TMP_ROOTS = ("/tmp",)  # the host folders a node replaces with its own (/dev/shm holds no code)


def host_paths_under_tmp(paths: Sequence[str]) -> tuple[str, ...]:
    """Of ``paths`` (absolute), those under the host's /tmp, which a node replaces with a /tmp of its
    own, with a path inside another one left out: the folders a node binds from the host so that a
    checkout, a venv or a HOME under /tmp (``git clone ... /tmp/x``, ``HOME=$(mktemp -d)``) is there
    in every node too, at the same path."""
    under = sorted({os.path.realpath(p) for p in paths
                    if any(os.path.realpath(p).startswith(root + "/") for root in SHARED_TMP_ROOTS)})
    return tuple(p for p in under if not any(p.startswith(q + "/") for q in under if q != p))


@dataclass(frozen=True)
class LinkCounters:
    """Bytes through a node's link since it was made, as the node's end of the veth counts them."""

    rx_bytes: int  # received by the node
    tx_bytes: int  # sent by the node


@dataclass(frozen=True)
class Node:
    """One node: where it is and the processes that hold it.

    Attributes:
        name: the node's name and hostname (``NAME-nK``).
        index: K, its position in the testbed.
        address: its IPv4 address on the testbed's /24 (no prefix length).
        namespace: its network namespace (``ip netns`` name).
        interface: its end of the link, inside ``namespace``.
        switch_port: the other end of the link, inside the switch namespace.
        anchor_pid: the anchor (the node's pid 1) as the host numbers it; commands enter its namespaces.
        unshare_pid: the ``unshare`` process that started the anchor and waits for it, as the host
            numbers it; `down` reaps it where this process is its parent.
    """

    name: str
    index: int
    address: str
    namespace: str
    interface: str
    switch_port: str
    anchor_pid: int
    unshare_pid: int

    def command(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """``argv`` as a command line that runs it inside this node.

        Args:
            argv: the program and its arguments.
            cwd: its working directory, a path the host and the node share (under /tmp only in the
                folders the node binds from the host, `host_paths_under_tmp`); None: ``/``.
        """
        enter = ["nsenter", "--target", str(self.anchor_pid), "--mount", "--uts", "--ipc", "--net", "--pid"]
        if cwd is not None:
            enter.append(f"--wd={cwd}")
        return [*enter, "--", *argv]

    def run(self, argv: Sequence[str], *, check: bool = True, timeout_s: float = 60.0, input: str | None = None,
            env: Mapping[str, str] | None = None, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside this node to completion, its output captured as text.

        Args:
            argv: the program and its arguments.
            check: raise when it exits non-zero.
            timeout_s: how long it may run.
            input: text for its stdin.
            env: its environment (default: this process's).
            cwd: see `command`.

        Raises:
            TestbedError: ``check`` and it exited non-zero (its stderr is in the message).
            subprocess.TimeoutExpired: it ran past ``timeout_s`` (it is killed).
        """
        done = subprocess.run(self.command(argv, cwd), capture_output=True, text=True, timeout=timeout_s,
                              input=input, env=None if env is None else dict(env))
        if check and done.returncode != 0:
            raise TestbedError(f"node {self.name}: `{' '.join(argv)}` failed ({done.returncode}): "
                               f"{done.stderr.strip()[-2000:]}")
        return done

    def popen(self, argv: Sequence[str], *, stdout: int | IO[Any] | None = subprocess.PIPE,
              stderr: int | IO[Any] | None = subprocess.PIPE, env: Mapping[str, str] | None = None,
              cwd: str | None = None, stdin: int | IO[Any] | None = subprocess.DEVNULL) -> subprocess.Popen[str]:
        """Start ``argv`` inside this node and return at once (a server, a long transfer).

        The caller owns the process; `down` kills it with the node if it is still running. Its
        stdin is empty unless ``stdin`` says otherwise (``subprocess.PIPE``: the caller talks to it).
        """
        return subprocess.Popen(self.command(argv, cwd), stdin=stdin, stdout=stdout, stderr=stderr,
                                text=True, env=None if env is None else dict(env))

    def is_alive(self) -> bool:
        """Whether the anchor still runs in this node's network namespace (a recycled pid does not count)."""
        return _pid_in_namespace(self.anchor_pid, self.namespace)

    def link_counters(self) -> LinkCounters:
        """The byte counters of this node's end of its link, read inside its namespace.

        Raises:
            TestbedError: the namespace or interface is gone.
        """
        shown = json.loads(run_tool(["ip", "-n", self.namespace, "-j", "-s", "link", "show", "dev", self.interface]))
        stats = shown[0]["stats64"]
        return LinkCounters(rx_bytes=int(stats["rx"]["bytes"]), tx_bytes=int(stats["tx"]["bytes"]))

    def to_dict(self) -> NodeState:
        """The fields as JSON values (the state file)."""
        return {"name": self.name, "index": self.index, "address": self.address, "namespace": self.namespace,
                "interface": self.interface, "switch_port": self.switch_port, "anchor_pid": self.anchor_pid,
                "unshare_pid": self.unshare_pid}

    @classmethod
    def from_dict(cls, data: NodeState) -> Node:
        """The inverse of `to_dict`."""
        return cls(**data)


def start_anchor(name: str, namespace: str, host_paths: Sequence[str] = (), python: str = sys.executable,
                 ) -> tuple[int, int]:
    """Start the anchor of node ``name`` in network namespace ``namespace`` and wait until its
    /dev/shm, /tmp and hostname are its own, with ``host_paths`` (folders of the host's /tmp,
    `host_paths_under_tmp`) bound into its /tmp at the same paths; ``python`` (this one by default)
    reaps the node's orphans, so the node must see it.

    Returns:
        (anchor_pid, unshare_pid) as the host numbers them.

    Raises:
        TestbedError: it exited or did not get ready in time; the message holds its stderr.
    """
    argv = ["ip", "netns", "exec", namespace,
            "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork", "--kill-child", "--mount-proc",
            "--propagation", "private", "--", "sh", "-c", _ANCHOR_SETUP, "sh", name, python, _REAPER,
            *host_paths]
    # its own session: a Ctrl-C in the terminal that ran `testbed up` does not reach the nodes
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        ready, _, _ = select.select([proc.stdout], [], [], ANCHOR_READY_TIMEOUT_S)
        line = proc.stdout.readline().strip() if ready else ""
        if line != ANCHOR_READY_LINE:
            if proc.poll() is None:
                proc.kill()
            _, err = proc.communicate(timeout=5)
            raise TestbedError(f"node {name}: its anchor did not start"
                               + (f" in {ANCHOR_READY_TIMEOUT_S:g} s" if not ready else "")
                               + f": {err.strip() or 'no message'}")
        anchor_pid = _anchor_below(proc.pid)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
    # the unshare outlives this Popen on purpose (the node stays up after `testbed up` exits):
    # marked done, Popen neither warns that it still runs nor reaps it behind `down`'s back
    proc.returncode = 0
    return anchor_pid, proc.pid


def stop_anchor(node: Node, timeout_s: float = 10.0) -> None:
    """Kill node's anchor and with it every process of the node's pid namespace; reap the
    ``unshare`` that waited for it where it is this process's child. Nothing if it is gone."""
    # only pids still in the node's namespace are the node's: a recorded pid may since have been
    # given to another process
    members = [pid for pid in (node.anchor_pid, node.unshare_pid) if _pid_in_namespace(pid, node.namespace)]
    if node.anchor_pid in members:
        # SIGKILL: pid 1 of a namespace ignores other signals it has no handler for; its death
        # makes the kernel kill the namespace's every process
        os.kill(node.anchor_pid, signal.SIGKILL)
    wait_gone(members, timeout_s, reap=True)
    if node.unshare_pid not in members:
        _reap_if_our_zombie(node.unshare_pid)  # an anchor that died before `down`


def wait_gone(pids: Sequence[int], timeout_s: float, reap: bool = False) -> list[int]:
    """Wait until none of ``pids`` runs (a zombie has exited); return those left.

    Args:
        pids: host pids.
        timeout_s: how long to wait.
        reap: also reap those that are this process's children: only for the testbed's own
            processes, never for one a caller started (its Popen would lose the exit status).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        left = []
        for pid in pids:
            if reap:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        continue  # our child, reaped now
                except ChildProcessError:
                    pass  # not our child: its parent (or init) reaps it
            if process_runs(pid):
                left.append(pid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def _reap_if_our_zombie(pid: int) -> None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            state, parent = f.read().rsplit(")", 1)[1].split()[:2]
        if state == "Z" and int(parent) == os.getpid():
            os.waitpid(pid, 0)
    except (OSError, ValueError, ChildProcessError):
        pass


def _pid_in_namespace(pid: int, namespace: str) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/run/netns/{namespace}").st_ino and process_runs(pid)
    except OSError:
        return False


def _anchor_below(pid: int) -> int:
    # `ip netns exec` execs `unshare` (same pid) and `unshare --fork` forks the anchor; walk down
    # single children to the first process in another pid namespace than ours, which is the anchor
    # whether or not an `ip` in between forked instead
    ours = os.readlink("/proc/self/ns/pid")
    for _ in range(3):
        pid = _only_child(pid)
        try:
            if os.readlink(f"/proc/{pid}/ns/pid") != ours:
                return pid
        except OSError as exc:
            raise TestbedError(f"the anchor's process {pid} is gone: {exc}") from exc
    raise TestbedError(f"no process in a new pid namespace below pid {pid}")


def _only_child(parent_pid: int) -> int:
    # /proc/PID/task/PID/children where the kernel has it, else a scan of every process's parent
    try:
        with open(f"/proc/{parent_pid}/task/{parent_pid}/children", encoding="utf-8") as f:
            children = [int(pid) for pid in f.read().split()]
    except OSError:
        children = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == parent_pid:
                        children.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    if len(children) != 1:
        raise TestbedError(f"the anchor's unshare (pid {parent_pid}) has {len(children)} children, expected one")
    return children[0]
