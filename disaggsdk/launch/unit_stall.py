"""Which live units have stopped making progress: silent for `serve.unit_stall_s`.

A unit that is stopped (SIGSTOP), wedged or starved keeps its process and its channel, so nothing
reports it dead while its streams freeze. Every frame a unit sends proves its loop ran; a unit that
has sent nothing for a quarter of the stall time is asked for its stats (`GetStats`), which its
loop answers between two steps; one silent for the whole stall time is stalled. A stalled unit that
speaks again is live again.
"""

from __future__ import annotations

PROBES_PER_STALL = 4  # a live unit is asked this many times before silence makes it stalled


class StallWatch:
    """Last-heard times of the units, and which of them are stalled. Called from one thread (the
    runtime's reader); `is_stalled` may be read from any.

    Args:
        stall_s: silence that makes a unit stalled (`serve.unit_stall_s`).
        names: the units, all heard at ``now_s``.
        now_s: `time.monotonic()` now.
    """

    def __init__(self, stall_s: float, names: list[str], now_s: float):
        self.stall_s = stall_s
        self.probe_s = stall_s / PROBES_PER_STALL
        self._heard_s = dict.fromkeys(names, now_s)
        self._probed_s = dict.fromkeys(names, now_s)
        self._stalled: set[str] = set()

    def is_stalled(self, name: str) -> bool:
        """Whether ``name`` has been silent for ``stall_s`` and not spoken since."""
        return name in self._stalled

    def heard(self, name: str, now_s: float) -> bool:
        """``name`` sent a frame. Returns True when that ends its stall."""
        self._heard_s[name] = now_s
        if name in self._stalled:
            self._stalled.discard(name)
            return True
        return False

    def restarted(self, name: str, now_s: float) -> None:
        """``name`` is a new process (or gone): it starts heard and not stalled."""
        self._heard_s[name] = self._probed_s[name] = now_s
        self._stalled.discard(name)

    def silent_s(self, name: str, now_s: float) -> float:
        """Seconds since ``name`` was last heard."""
        return now_s - self._heard_s[name]

    def check(self, live: list[str], now_s: float) -> tuple[list[str], list[str]]:
        """Of the ``live`` units: those that just became stalled, and those to ask for their stats
        now (silent for a probe interval and not asked within one).

        Returns:
            (newly stalled, to probe).
        """
        stalled, probe = [], []
        for name in live:
            silent_s = now_s - self._heard_s[name]
            if silent_s >= self.stall_s and name not in self._stalled:
                self._stalled.add(name)
                stalled.append(name)
            # a stalled unit is asked once a stall time only: a stopped process reads nothing, and
            # what the runtime sends it fills its socket until a send would block the runtime
            every_s = self.stall_s if name in self._stalled else self.probe_s
            if silent_s >= self.probe_s and now_s - self._probed_s[name] >= every_s:
                self._probed_s[name] = now_s
                probe.append(name)
        return stalled, probe
