"""A unit's heartbeat: a thread of its own that tells the runtime the unit is reachable.

The unit's loop speaks only between steps, and one step can hold it for many seconds (a 16,384-token
prefill: 20 s on a 2-core box), so its silence cannot tell a busy unit from one the runtime no longer
reaches (a cut link, a frozen process). This thread sends `messages.Heartbeat` every quarter of
`serve.unit_unreachable_s` whatever the loop does: a unit whose heartbeats stop arriving is
unreachable (`launch.unit_silence`), one whose loop is silent but whose heartbeats arrive is only busy
or stalled (`launch.unit_stall`). Sends share the channel's send lock with the loop.
"""

from __future__ import annotations

import threading

from disaggsdk.launch import messages as ch
from disaggsdk.launch.channel import ChannelClosed, FrameChannel

BEATS_PER_UNREACHABLE = 4  # heartbeats sent within `serve.unit_unreachable_s`: three may be late or lost


class UnitHeartbeat:
    """Send a `Heartbeat` on ``conn`` every ``interval_s`` from a daemon thread until `stop` or the
    channel closes.

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
