"""Which live units have stopped making progress: silent for `serve.unit_stall_s`.

A unit that is stopped (SIGSTOP), wedged or starved keeps its process and its channel, so nothing
reports it dead while its streams freeze. Every frame a unit's loop sends proves its loop ran (its
heartbeat does not: a thread of its own sends that, `launch.unit_heartbeat`); a unit whose loop has
sent nothing for a quarter of the stall time is asked for its stats (`GetStats`), which its loop
answers between two steps; one silent for the whole stall time is stalled. A stalled unit that
speaks again is live again.
"""

from __future__ import annotations

from disaggsdk.launch.unit_silence import SilenceWatch

PROBES_PER_STALL = 4  # a live unit is asked this many times before silence makes it stalled


class StallWatch(SilenceWatch):
    """A `SilenceWatch` of the units' loops over `serve.unit_stall_s` that also says whom to ask
    for their stats.

    Args:
        stall_s: silence that makes a unit stalled (`serve.unit_stall_s`).
        names: the units, all heard at ``now_s``.
        now_s: `time.monotonic()` now.
    """

    def __init__(self, stall_s: float, names: list[str], now_s: float):
        super().__init__(stall_s, names, now_s)
        self.probe_s = stall_s / PROBES_PER_STALL
        self._probed_s = dict.fromkeys(names, now_s)

    def restarted(self, name: str, now_s: float) -> None:
        """``name`` is a new process (or gone): it starts heard, asked and not stalled."""
        super().restarted(name, now_s)
        self._probed_s[name] = now_s

    def check(self, live: list[str], now_s: float) -> tuple[list[str], list[str]]:
        """Of the ``live`` units: those that just became stalled, and those to ask for their stats
        now (silent for a probe interval and not asked within one).

        Returns:
            (newly stalled, to probe).
        """
        stalled = self.newly_silent(live, now_s)
        probe = []
        for name in live:
            # a stalled unit is asked once a stall time only: a stopped process reads nothing, and
            # what the runtime sends it fills its socket until a send would block the runtime
            every_s = self.limit_s if self.is_silent(name) else self.probe_s
            if self.silent_s(name, now_s) >= self.probe_s and now_s - self._probed_s[name] >= every_s:
                self._probed_s[name] = now_s
                probe.append(name)
        return stalled, probe
