"""A launch's start-up lines: in a notebook one cell output redrawn as each line arrives.

`Cluster.launch` says what a quiet minute is spent on, a line per unit and step (loading weights,
compiling, ready). A terminal scrolls them by; in a notebook they would stay as a dozen lines of
output for every launch. There the cell keeps one small block, the latest lines, which ends as the
deployment's ready lines, and every line goes to the ``disaggsdk.launch`` logger.
"""

from __future__ import annotations

import logging
import threading
from collections import deque

from disaggsdk.report.live_output import LiveOutput, in_kernel

log = logging.getLogger("disaggsdk.launch")

NUM_LINES_SHOWN = 2  # the ready lines at the end: the units' (with their logs' directory) and the endpoint's


class StartupStatus:
    """A progress listener (``launch(on_progress=...)``): call it with each line. In a Jupyter kernel it
    shows the latest `NUM_LINES_SHOWN` lines in one redrawn cell output (`live_output.LiveOutput`) and
    logs every line; elsewhere it prints each line on stdout.

    Attributes:
        lines: every line said so far, oldest first.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._latest: deque[str] = deque(maxlen=NUM_LINES_SHOWN)
        self._output = LiveOutput("startup")
        self._lock = threading.Lock()  # lines come from the launching thread and from the runtime's threads

    def __call__(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)
            self._latest.append(line)
            if not in_kernel():
                print(line, flush=True)  # stdout: in a notebook's output stderr would be a red box
                return
            log.info("%s", line)
            bundle = {"text/plain": "\n".join(self._latest)}
            if self._output.shown:
                self._output.redraw(bundle)
            else:
                self._output.show(bundle)
