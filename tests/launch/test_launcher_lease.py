"""`LauncherLease`: a unit that cannot close cleanly still exits, its /dev/shm files removed, within
its grace after a SIGTERM or after its parent (the launcher) dies, even without PDEATHSIG."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import ROOT

GRACE_S = 0.5
# a unit whose loop never ends: it owns a file named as libfabric's shm provider names one
STUCK_UNIT = f"""
import os, time
from disaggsdk.launch.unit_process.launcher_lease import LauncherLease
open(f"/dev/shm/{{os.getpid()}}:999:0", "w").close()
lease = LauncherLease(os.getppid(), grace_s={GRACE_S})
# os.write, not print: the stop runs in the SIGTERM handler, which may interrupt the main thread's own
# print of its pid inside the buffered writer (a reentrant print there raises RuntimeError)
lease.on_stop(lambda: os.write(1, b"stop asked\\n"))
lease.start()  # SIGTERM asks for the stop from here on
print(os.getpid(), flush=True)
while True:
    time.sleep(1)
"""
# the unit's launcher: starts it, says its pid, waits (the test kills it with SIGKILL)
LAUNCHER = f"""
import subprocess, sys, time
unit = subprocess.Popen([sys.executable, "-c", {STUCK_UNIT!r}], stdout=sys.stdout)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while (_alive(pid) or os.path.exists(f"/dev/shm/{pid}:999:0")) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid) and not os.path.exists(f"/dev/shm/{pid}:999:0")


def _clean(*pids: int) -> None:
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
        if os.path.exists(f"/dev/shm/{pid}:999:0"):
            os.unlink(f"/dev/shm/{pid}:999:0")


def test_a_unit_that_does_not_stop_on_sigterm_exits_after_its_grace_without_its_files():
    unit = subprocess.Popen([sys.executable, "-c", STUCK_UNIT], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert int(unit.stdout.readline()) == unit.pid and os.path.exists(f"/dev/shm/{unit.pid}:999:0")
        started = time.monotonic()
        unit.send_signal(signal.SIGTERM)
        assert unit.wait(10) == 143 and time.monotonic() - started >= GRACE_S  # 128 + SIGTERM
        assert not os.path.exists(f"/dev/shm/{unit.pid}:999:0")
        assert unit.stdout.read() == "stop asked\n"  # the loop's own stop was asked for first
    finally:
        _clean(unit.pid)
        unit.stdout.close()


def test_a_unit_whose_launcher_died_without_pdeathsig_exits_without_its_files():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    unit_pid = 0
    try:
        unit_pid = int(launcher.stdout.readline())
        assert os.path.exists(f"/dev/shm/{unit_pid}:999:0")
        launcher.kill()
        launcher.wait()
        assert _wait_gone(unit_pid, 5), "the unit outlived its launcher, or left its file"
        assert launcher.stdout.read() == "stop asked\n"  # the unit saw its parent change
    finally:
        _clean(launcher.pid, unit_pid)
        launcher.stdout.close()
