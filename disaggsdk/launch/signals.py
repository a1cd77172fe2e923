"""What SIGTERM means, in the one place that installs its handlers: a clean exit everywhere, so
no unit or shared memory is left.

Python's default SIGTERM ends the process without unwinding: `with start_local_runtime(...)` blocks and
atexit handlers never run (the units still die with their parent, but a killed unit cannot
remove its libfabric shm files). So in the driver (every `disaggsdk` command, `cli.main`) SIGTERM
unwinds like Ctrl-C (`sigterm_unwinds`; SIGINT already raises KeyboardInterrupt), and in a unit it
asks the unit's loop to stop (`sigterm_calls`, installed by `unit_process.launcher_lease.LauncherLease`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

SIGTERM_EXIT_CODE = 143


def _raise_exit(_signum: int, _frame: object) -> None:
    raise SystemExit(SIGTERM_EXIT_CODE)


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(143) in the main thread (no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def sigterm_calls(stop: Callable[[], None]) -> None:
    """From now on SIGTERM calls ``stop`` (call from the main thread): a unit closes cleanly.

    ``stop`` runs in the signal handler: it should only set a flag or start a thread.
    """
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop())
