"""Files libfabric's shm provider leaves in /dev/shm when a process dies without closing its endpoint."""

from __future__ import annotations

import os

SHM_DIR = "/dev/shm"


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
