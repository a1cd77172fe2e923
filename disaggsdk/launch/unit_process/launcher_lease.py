"""A unit's lease on its launcher: when the launcher dies (even by SIGKILL), the unit closes and
takes its /dev/shm files with it, within `UNIT_EXIT_GRACE_S`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from disaggsdk.launch.signals import SIGTERM_EXIT_CODE, sigterm_calls
from disaggsdk.transfer.shm_files import remove_fabric_shm

UNIT_EXIT_GRACE_S = 5.0  # a clean close takes well under a second; a stop may take 15 s in all
PARENT_POLL_S = 0.5  # how often the lease looks at the unit's parent


class LauncherLease:
    """The stop a unit owes its launcher's death or a SIGTERM, with a deadline.

    Args:
        parent_pid: the unit's parent now (its launcher, or a Ray actor).
        grace_s: how long a clean close may take before the unit removes its shm files and exits.
    """

    def __init__(self, parent_pid: int, grace_s: float = UNIT_EXIT_GRACE_S):
        self.parent_pid = parent_pid
        self.grace_s = grace_s
        self.stop_requested = threading.Event()
        self._on_stop: Callable[[], None] = lambda: None
        self._lock = threading.RLock()  # the SIGTERM handler may run while the main thread holds it

    def start(self) -> None:
        """Stop on SIGTERM from now on, and watch the parent from a daemon thread (it ends with the
        process). Call from the main thread."""
        sigterm_calls(self.request_stop)
        threading.Thread(target=self._watch_parent, name="disaggsdk-launcher-lease", daemon=True).start()

    def on_stop(self, stop: Callable[[], None]) -> None:
        """Call ``stop`` (the unit loop's own stop) when a stop is asked for, now if one was already.

        ``stop`` may run in a signal handler or in the lease's thread: it should only set a flag.
        """
        with self._lock:
            self._on_stop = stop
            asked = self.stop_requested.is_set()
        if asked:
            stop()

    def request_stop(self) -> None:
        """Ask the unit to stop and start the deadline; a second request changes nothing."""
        with self._lock:
            if self.stop_requested.is_set():
                return
            self.stop_requested.set()
            stop = self._on_stop
        threading.Thread(target=self._deadline, name="disaggsdk-exit-deadline", daemon=True).start()
        stop()

    def _watch_parent(self) -> None:
        while os.getppid() == self.parent_pid:
            time.sleep(PARENT_POLL_S)
        self.request_stop()

    def _deadline(self) -> None:
        time.sleep(self.grace_s)
        exit_now()


def exit_now(code: int = SIGTERM_EXIT_CODE) -> NoReturn:
    """Remove this process's libfabric shm files and exit at once, without closing anything.

    For a unit that cannot close cleanly: its endpoint goes with the process, so its file is
    removed while the endpoint is still open (no peer can use it after this anyway).
    """
    remove_fabric_shm(os.getpid())
    os._exit(code)

