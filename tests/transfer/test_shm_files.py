"""Leftover shm-provider files: those of dead processes go, those of live ones stay."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from disaggsdk.transfer.shm_files import SHM_DIR, remove_orphaned_fabric_shm


def test_only_files_of_dead_processes_are_removed():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live_name, dead_name, other_name = f"{os.getpid()}:990:0", f"{dead.pid}:990:0", f"{dead.pid}-not-fabric"
    paths = [os.path.join(SHM_DIR, n) for n in (live_name, dead_name, other_name)]
    for path in paths:
        open(path, "wb").close()
    try:
        removed = remove_orphaned_fabric_shm()
        assert dead_name in removed and live_name not in removed
        assert os.path.exists(paths[0]) and not os.path.exists(paths[1])
        assert os.path.exists(paths[2])  # not a name the shm provider writes: never ours to remove
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)


def test_files_of_a_zombie_are_removed():
    # a unit whose launcher was SIGKILLed dies by PDEATHSIG and waits, a zombie, for init to reap it
    # (late, on some machines); it holds no endpoint any more
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    while open(f"/proc/{zombie.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)  # not waited for: it stays a zombie until zombie.wait()
    path = os.path.join(SHM_DIR, f"{zombie.pid}:991:0")
    open(path, "wb").close()
    try:
        assert f"{zombie.pid}:991:0" in remove_orphaned_fabric_shm() and not os.path.exists(path)
    finally:
        zombie.wait()
        if os.path.exists(path):
            os.unlink(path)
