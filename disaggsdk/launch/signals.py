"""SIGTERM as a clean exit, so a runtime's `close()` runs and no unit or shared memory is left.

Python's default SIGTERM ends the process without unwinding: `with LocalRuntime(...)` blocks and
atexit handlers never run (the units still die with their parent, but a killed unit cannot
remove its libfabric shm files). SIGINT already raises KeyboardInterrupt, which unwinds.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
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
