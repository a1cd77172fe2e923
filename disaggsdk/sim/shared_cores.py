"""A CPU machine's cores shared by everything that runs on it, as processor sharing."""

from __future__ import annotations

from collections.abc import Hashable


class SharedCores:
    """Processor sharing of ``cores`` among keyed jobs plus a steady background demand.

    Args:
        cores: how many cores everything shares.
    """

    def __init__(self, cores: int):
        if cores < 1:
            raise ValueError(f"cores must be at least 1, got {cores}")
        self.cores = cores
        self.background_cores = 0.0
        self._work_left_s: dict[Hashable, float] = {}  # solo seconds of work each job still has
        self._version: dict[Hashable, int] = {}
        self._since_s = 0.0

    def rate(self) -> float:
        """The fraction of its solo speed at which every runnable job advances now."""
        demand = len(self._work_left_s) + self.background_cores
        return min(1.0, self.cores / demand) if demand > 0 else 1.0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._work_left_s

    def __len__(self) -> int:
        return len(self._work_left_s)

    def _advance(self, now_s: float) -> None:
        """Charge the work done since the last change at the rate that held meanwhile."""
        done_s = (now_s - self._since_s) * self.rate()
        for key in self._work_left_s:
            self._work_left_s[key] -= done_s
        self._since_s = now_s

    def add_work(self, key: Hashable, work_s: float, now_s: float) -> None:
        """Give job ``key`` ``work_s`` more solo seconds of work (starting it if it is idle)."""
        self._advance(now_s)
        self._work_left_s[key] = max(0.0, self._work_left_s.get(key, 0.0)) + work_s

    def finish(self, key: Hashable, now_s: float) -> None:
        """Job ``key`` is done: it leaves the cores."""
        self._advance(now_s)
        del self._work_left_s[key]

    def set_background(self, cores: float, now_s: float) -> None:
        """Steady demand (in cores) from things not modelled as jobs, e.g. idle units polling."""
        if cores != self.background_cores:
            self._advance(now_s)
            self.background_cores = cores

    def completions(self, now_s: float) -> list[tuple[float, Hashable, int]]:
        """(finish time, key, version) of every job at the current rate; older versions go stale."""
        rate = self.rate()
        out = []
        for key, left_s in self._work_left_s.items():
            version = self._version.get(key, 0) + 1
            self._version[key] = version
            out.append((now_s + max(0.0, left_s) / rate, key, version))
        return out

    def is_current(self, key: Hashable, version: int) -> bool:
        """Whether a completion event for ``key`` still holds (no change since it was computed)."""
        return key in self._work_left_s and self._version.get(key) == version
