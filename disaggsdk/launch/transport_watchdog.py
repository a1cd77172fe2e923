"""Notice when a unit's transport thread is stuck inside libfabric for good.

With libfabric's shm provider every receiver's queue is guarded by a spinlock in shared memory. A
process killed (SIGKILL, OOM) while holding a peer's lock leaves it held by nobody alive: from then
on every write or message to that peer spins forever inside `fi_writedata`/`fi_send`, and a
receiver whose own lock is lost spins inside `fi_cq_read`. Nothing in the process can undo that
(native/README.md). The only cure is new endpoints, that is new processes, so the unit that sees
its thread stuck reports `TransportStuck` (naming the peer whose queue is poisoned, if it was
posting to one) and exits; the runtime restarts it and replaces that peer as well.
Without this, a wedged unit looks alive: it keeps pages quarantined and requests waiting forever.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from disaggsdk.launch.messages import TransportStuck
from disaggsdk.messenger.peers import PeerId

if TYPE_CHECKING:
    from disaggsdk.launch.base import UnitHandle
    from disaggsdk.transfer import TransferEngine

CHECK_EVERY_S = 0.5  # how often the unit's loop looks (a check is two native reads)
EXIT_CODE = 75  # EX_TEMPFAIL: the unit gave up on a stuck transport and wants a restart


class TransportWatchdog:
    """Watches one `TransferEngine`'s progress thread from the unit's loop.

    Args:
        transfer: the unit's `TransferEngine`.
        stuck_after_s: how long one round of its progress thread may take (spec
            `transport.stuck_after_s`; a healthy round takes microseconds).
    """

    def __init__(self, transfer: TransferEngine, stuck_after_s: float):
        self.transfer, self.stuck_after_s = transfer, stuck_after_s
        self._peer_ids: dict[bytes, str] = {}  # a peer's transport address -> "name#incarnation"
        self._next_check_s = 0.0
        self._last_check_s: float | None = None

    def know_peer(self, address: bytes, peer_id: str) -> None:
        """Remember whose address ``address`` is, to name a poisoned peer."""
        self._peer_ids[bytes(address)] = peer_id

    def check(self, now_s: float) -> TransportStuck | None:
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
        return TransportStuck(stuck_s=stuck_s, poisoned_peer=poisoned)


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
