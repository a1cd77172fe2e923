"""Fault injection for tests: leave a peer's libfabric shm queue lock held by a dead process.

`freeze_in_peer_lock.c` (an LD_PRELOAD library, built here with the system C compiler that the
native transport needs anyway) makes an armed process keep the next spinlock it takes in another
process's /dev/shm file and stop; the test then SIGKILLs it. That is the state a process killed
inside libfabric's shm critical section leaves, reached on purpose rather than by luck.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("freeze_in_peer_lock.c")
MARK_DIR_ENV = "DISAGGSDK_FREEZE_MARK_DIR"


def build_freeze_shim(out_dir: Path) -> Path:
    """Compile the injector into ``out_dir``; skips the test where there is no C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the fault injector")
    out = out_dir / "freeze_in_peer_lock.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(SOURCE), "-ldl"], check=True)
    return out


def preload_env(shim: Path, mark_dir: Path) -> dict[str, str]:
    """The environment variables that load the injector into a process started with them."""
    return {"LD_PRELOAD": str(shim), MARK_DIR_ENV: str(mark_dir)}


def freeze_then_kill(pid: int, mark_dir: Path, timeout_s: float = 30.0) -> None:
    """Arm ``pid``, wait until it holds a peer's lock, then SIGKILL it (the lock stays held)."""
    mark = mark_dir / f"frozen-{pid}"
    deadline = time.monotonic() + timeout_s
    while not mark.exists():
        os.kill(pid, signal.SIGUSR2)  # again each round: harmless once armed
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} never took a peer's lock within {timeout_s} s")
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
