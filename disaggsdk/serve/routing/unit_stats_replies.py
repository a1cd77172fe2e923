"""The units' `UnitStats` answers as the router collects them: the latest from each unit, and the
answers to one question (`gather`) awaited until every healthy unit asked has replied."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import Runtime


class UnitStatsReplies:
    """Collects `UnitStats` messages (from the runtime's reader thread) for the router's callers.

    Args:
        runtime: the units (asked with ``send``; a unit that stops being healthy is not waited for).
    """

    def __init__(self, runtime: Runtime):
        self.runtime = runtime
        self._cond = threading.Condition()
        self._replies: dict[int, dict[str, ch.UnitStats]] = {}  # only for seqs `gather` waits on
        self._last: dict[str, ch.UnitStats] = {}

    def received(self, msg: ch.UnitStats) -> None:
        """A unit's answer arrived: the latest of its unit, and the reply to a waiting question."""
        with self._cond:
            self._last[msg.name] = msg
            if msg.seq in self._replies:
                self._replies[msg.seq][msg.name] = msg
            self._cond.notify_all()

    def unit_down(self, name: str) -> None:
        """Unit ``name`` died: its gauges go, and questions stop waiting for it."""
        with self._cond:
            self._last.pop(name, None)
            self._cond.notify_all()

    def last(self) -> dict[str, ch.UnitStats]:
        """The latest answer of every unit that has answered."""
        with self._cond:
            return dict(self._last)

    def gather(self, units: Iterable[str], seq: int, ask: ch.GetStats | ch.ResetPrefixCache,
               timeout_s: float) -> dict[str, ch.UnitStats]:
        """Send ``ask`` (a message carrying ``seq``) to ``units`` and wait, at most ``timeout_s``,
        for the answers of those still healthy. Returns the answers that came."""
        with self._cond:
            self._replies[seq] = {}
        asked = [n for n in units if self.runtime.send(n, ask)]
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                got = self._replies.get(seq, {})
                want = {n for n in asked if self.runtime.is_healthy(n)}
                remaining_s = deadline - time.monotonic()
                if want <= set(got) or remaining_s <= 0:
                    return dict(self._replies.pop(seq, {}))
                self._cond.wait(min(0.1, remaining_s))
