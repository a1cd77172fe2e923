"""The processes every request and token passes through on a CPU machine, as FIFO stages."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from disaggsdk.sim.shared_cores import SharedCores


@dataclass
class _Item:
    hops: list[tuple[str, float]]  # (stage, CPU seconds) still to go, in order
    on_done: Callable[[float], None]  # called with the time the last hop ends


class FrontEnd:
    """FIFO stages (``"server"``, ``"client"``) whose work runs as jobs on shared cores.

    The simulator routes completions of jobs keyed ``("process", stage)`` to `job_done` and
    re-times the cores after every call (``reschedule``).
    """

    def __init__(self, cores: SharedCores, reschedule: Callable[[float], None]):
        self._cores = cores
        self._reschedule = reschedule
        self._queues: dict[str, deque[_Item]] = {}

    def submit(self, hops: list[tuple[str, float]], on_done: Callable[[float], None], now_s: float) -> None:
        """Send an item through ``hops`` (stages with no work are skipped); ``on_done`` at the end."""
        self._next_hop(_Item([h for h in hops if h[1] > 0], on_done), now_s)

    def _next_hop(self, item: _Item, now_s: float) -> None:
        if not item.hops:
            item.on_done(now_s)
            return
        stage, work_s = item.hops[0]
        queue = self._queues.setdefault(stage, deque())
        queue.append(item)
        if len(queue) == 1:  # the stage was idle: this item starts now
            self._cores.add_work(("process", stage), work_s, now_s)
            self._reschedule(now_s)

    def job_done(self, stage: str, now_s: float) -> None:
        """The head item of ``stage`` got its CPU time: it moves on, the next one starts."""
        queue = self._queues[stage]
        item = queue.popleft()
        item.hops.pop(0)
        if queue:
            self._cores.add_work(("process", stage), queue[0].hops[0][1], now_s)
        self._reschedule(now_s)
        self._next_hop(item, now_s)

    @property
    def idle(self) -> bool:
        """No item in any stage."""
        return not any(self._queues.values())
