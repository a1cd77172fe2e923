"""Files libfabric's shm provider leaves in /dev/shm when a process dies without closing its endpoint."""

from __future__ import annotations

import os
import re

SHM_DIR = "/dev/shm"
# the shm provider names an endpoint's file "<pid>:<endpoint>:<n>"
_FABRIC_NAME = re.compile(r"^(\d+):\d+:\d+$")


def remove_fabric_shm(pid: int) -> None:
    """Remove the shm provider's files of a dead process (named "<pid>:..." in /dev/shm).

    libfabric unlinks them when an endpoint closes; a killed process never gets there. Call it
    only for a process known to be dead: a live one's endpoint would lose its file.
    """
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(f"{pid}:"):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    # a zombie (dead, not yet reaped: orphans wait for init, which may reap late) holds no endpoint
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def remove_orphaned_fabric_shm() -> list[str]:
    """Remove every shm-provider file whose process is gone (a launcher killed with SIGKILL leaves
    one per unit: its units die by PDEATHSIG and never close their endpoints).

    Files of live processes are never touched. Returns the names removed.
    """
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    removed = []
    for name in names:
        match = _FABRIC_NAME.match(name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            os.unlink(os.path.join(SHM_DIR, name))
            removed.append(name)
        except OSError:
            pass  # removed by another launch meanwhile, or not ours to remove
    return removed
