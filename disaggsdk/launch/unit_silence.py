"""Which live units have been silent too long: nothing heard from them for ``limit_s``.

The runtime keeps two of these over different frames. Reachability: any frame, the heartbeat
included (`launch.unit_heartbeat`), for `serve.unit_unreachable_s`; a unit silent that long is
unreachable (its node's link is cut, or its process frozen), since its heartbeat thread speaks
whatever its loop does. Progress: every frame but the heartbeat, for `serve.unit_stall_s`
(`launch.unit_stall.StallWatch`, which also asks silent units for their stats); a unit busy in a
20 s step is stalled yet reachable. A unit heard again is no longer silent.
"""

from __future__ import annotations


class SilenceWatch:
    """When each unit was last heard, and which have been silent for ``limit_s``. Called from one
    thread (the runtime's reader); `is_silent` may be read from any.

    Args:
        limit_s: silence that counts (`serve.unit_unreachable_s`, `serve.unit_stall_s`).
        names: the units, all heard at ``now_s``.
        now_s: `time.monotonic()` now.
    """

    def __init__(self, limit_s: float, names: list[str], now_s: float):
        self.limit_s = limit_s
        self._heard_s = dict.fromkeys(names, now_s)
        self._silent: set[str] = set()

    def is_silent(self, name: str) -> bool:
        """Whether ``name`` has been silent for ``limit_s`` and not heard since."""
        return name in self._silent

    def heard(self, name: str, now_s: float) -> bool:
        """``name`` sent a frame this watch counts. Returns True when that ends its silence."""
        self._heard_s[name] = now_s
        if name in self._silent:
            self._silent.discard(name)
            return True
        return False

    def restarted(self, name: str, now_s: float) -> None:
        """``name`` is a new process (or gone): it starts heard."""
        self._heard_s[name] = now_s
        self._silent.discard(name)

    def silent_s(self, name: str, now_s: float) -> float:
        """Seconds since ``name`` was last heard."""
        return now_s - self._heard_s[name]

    def newly_silent(self, live: list[str], now_s: float) -> list[str]:
        """Of the ``live`` units, those silent for ``limit_s`` just now (each reported once per silence)."""
        newly = [name for name in live if name not in self._silent and now_s - self._heard_s[name] >= self.limit_s]
        self._silent.update(newly)
        return newly
