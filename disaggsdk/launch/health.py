"""Whether a unit is alive: every check, on both sides of its channel."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import ChannelClosed
from disaggsdk.launch.channel import FrameChannel
from disaggsdk.messenger.peers import PeerId

if TYPE_CHECKING:
    from disaggsdk.launch.base import UnitHandle
    from disaggsdk.transfer import TransferEngine

BEATS_PER_UNREACHABLE = 4  # heartbeats sent within `$.serve.unit_unreachable_s`: three may be late or lost
PROBES_PER_STALL = 4  # a live unit is asked this many times before silence makes it stalled
CHECK_EVERY_S = 0.5  # how often the unit's loop looks at its transport (a check is two native reads)
EXIT_CODE = 75  # EX_TEMPFAIL: the unit gave up on a stuck transport and wants a restart


# unreachable: the unit's heartbeat, the runtime's watch over every frame


class UnitHeartbeat:
    """Send a `Heartbeat` on ``conn`` every ``interval_s`` from a daemon thread until `stop` or the
    channel closes. Sends share the channel's send lock with the unit's loop.

    Args:
        conn: the unit's channel to the runtime (thread-safe sends).
        interval_s: seconds between two heartbeats.
    """

    def __init__(self, conn: FrameChannel[ch.ToUnit], interval_s: float):
        self._conn, self.interval_s = conn, interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disaggsdk-heartbeat", daemon=True)

    @classmethod
    def for_unreachable_s(cls, conn: FrameChannel[ch.ToUnit], unreachable_s: float) -> UnitHeartbeat:
        """A heartbeat paced for a runtime that reads ``unreachable_s`` of silence as unreachable."""
        return cls(conn, unreachable_s / BEATS_PER_UNREACHABLE)

    def start(self) -> None:
        """Send the first heartbeat now, then one every ``interval_s``."""
        self._thread.start()

    def stop(self) -> None:
        """Send no more (the thread ends within ``interval_s``, or once a blocked send returns)."""
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                # blocks while the link is cut and the socket's buffer is full; the loop's sends too
                self._conn.send(ch.Heartbeat())
            except ChannelClosed:
                return  # the runtime is gone: the unit's lease stops it
            self._stopped.wait(self.interval_s)


class SilenceWatch:
    """When each unit was last heard, and which have been silent for ``limit_s``. Called from one
    thread (the runtime's reader); `is_silent` may be read from any.

    The runtime keeps two: this one over every frame for `$.serve.unit_unreachable_s`, and a
    `StallWatch` over the loops' frames. A unit heard again is no longer silent.

    Args:
        limit_s: silence that counts (`$.serve.unit_unreachable_s`, `$.serve.unit_stall_s`).
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


# stalled: the runtime's watch over the loops' frames, asking the silent ones


class StallWatch(SilenceWatch):
    """A `SilenceWatch` of the units' loops over `$.serve.unit_stall_s` that also says whom to ask
    for their stats.

    Args:
        stall_s: silence that makes a unit stalled (`$.serve.unit_stall_s`).
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


# stuck in its transport: the unit's watchdog, the runtime's replacement of the poisoned peer


class TransportWatchdog:
    """Watches one `TransferEngine`'s progress thread from the unit's loop.

    Args:
        transfer: the unit's `TransferEngine`.
        stuck_after_s: how long one round of its progress thread may take (spec
            `$.transport.stuck_after_s`; a healthy round takes microseconds).
    """

    def __init__(self, transfer: TransferEngine, stuck_after_s: float):
        self.transfer, self.stuck_after_s = transfer, stuck_after_s
        self._peer_ids: dict[bytes, str] = {}  # a peer's transport address -> "name#incarnation"
        self._next_check_s = 0.0
        self._last_check_s: float | None = None

    def know_peer(self, address: bytes, peer_id: str) -> None:
        """Remember whose address ``address`` is, to name a poisoned peer."""
        self._peer_ids[bytes(address)] = peer_id

    def check(self, now_s: float) -> ch.TransportStuck | None:
        """A `TransportStuck` report once the thread has been stuck too long, seen by two checks
        close together (one after a long absence of this loop only starts the count), else None."""
        if now_s < self._next_check_s:
            return None
        self._next_check_s = now_s + CHECK_EVERY_S
        last_s, self._last_check_s = self._last_check_s, now_s
        stuck_s = self.transfer.health.round_age_s()
        if stuck_s < self.stuck_after_s:
            return None
        if last_s is None or now_s - last_s > max(2 * CHECK_EVERY_S, self.stuck_after_s / 2):
            # this loop was away for long itself (a long step, or the whole process stopped: SIGSTOP,
            # a paused VM), so the thread's old round may only mean it has not been scheduled since:
            # it gets until the next check to finish one (a unit stopped 6 s had exited as stuck)
            return None
        peer = self.transfer.health.posting_to()  # read after the age: a late post cannot be blamed
        poisoned = self._peer_ids.get(peer.address, "unknown peer") if peer is not None else None
        return ch.TransportStuck(stuck_s=stuck_s, poisoned_peer=poisoned)


def replace_poisoned_peer(units: Mapping[str, UnitHandle], peer: str, reporter: str, say: Callable[[str], None]) -> None:
    """The runtime's side: kill the unit incarnation ``peer`` names.

    Its transport queue can never be used again (its lock is held by a dead process), so every
    unit sending to it would get stuck too. It comes back through the runtime's usual restart;
    an older incarnation, or a unit already down, is left alone.
    """
    poisoned = PeerId.parse(peer)
    target = units.get(poisoned.name)
    if target is None or not target.healthy or target.info is None or target.info.peer_id != poisoned:
        return
    target.fatal = f"replaced: its transport queue is poisoned ({reporter} got stuck sending to it)"
    say(f"unit {poisoned.name}: {target.fatal}")
    target.process.kill()
