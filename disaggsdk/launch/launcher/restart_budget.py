"""How often a unit may be restarted: a number of restarts within a sliding window, not for life.

A lifetime count let sporadic deaths end a deployment for good, however far apart: a hostile probe
once ended one with five requests, each of which took a unit down. With a window, restarts
older than ``window_s`` are forgiven, so what a burst of deaths spends comes back, while a unit that
crashes in a loop (more than ``max_restarts`` deaths within the window) still stays down, as
Kubernetes' crash-loop back-off and systemd's ``StartLimitIntervalSec`` do.
"""

from __future__ import annotations

import time
from collections import deque

DEFAULT_RESTART_WINDOW_S = 600.0


class RestartBudget:
    """One unit's restarts within the last ``window_s`` seconds.

    Args:
        max_restarts: restarts allowed within the window (0: never restarted).
        window_s: how long a restart counts against the budget.
    """

    def __init__(self, max_restarts: int, window_s: float = DEFAULT_RESTART_WINDOW_S):
        self.max_restarts, self.window_s = max_restarts, window_s
        self._times_s: deque[float] = deque()  # time.monotonic() of each counted restart

    def used(self, now_s: float | None = None) -> int:
        """Restarts within the window ending at ``now_s``."""
        now_s = time.monotonic() if now_s is None else now_s
        while self._times_s and now_s - self._times_s[0] > self.window_s:
            self._times_s.popleft()
        return len(self._times_s)

    def allows(self, now_s: float | None = None) -> bool:
        """Whether one more restart fits in the window."""
        return self.used(now_s) < self.max_restarts

    def spend(self, now_s: float | None = None) -> int:
        """Count a restart; returns which attempt within the window it is (1, 2, ...)."""
        now_s = time.monotonic() if now_s is None else now_s
        self.used(now_s)
        self._times_s.append(now_s)
        return len(self._times_s)
