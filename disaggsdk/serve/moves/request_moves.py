"""The router's book of decoding requests moving between decode units, and of units being drained.

A move is asked of the request's unit (the source, `launch.messages.MoveRequest`). Its target says
`RequestMovedIn` before any token of the request; the source says `RequestMoveEnded` after its last
token of it (one channel each, each in order). Between the two, the target's tokens are held here
(`Move.held`) and delivered only once the source's end is read, so a client sees every token once
and in order, whichever channel the router reads first. A move that did not happen drops what the
target sent: the source goes on, from exactly where the client is.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.launch.messages import Tokens


class MoveError(DisaggError):
    """A lever (move, drain, rebalance) that cannot be asked for: the request, unit or layout is not one
    it can take (HTTP 400)."""


class LeverConflict(MoveError):
    """A lever the deployment's state refuses now (HTTP 409): it would leave a role with no routable unit,
    it needs a unit that is down or drained, or another rebalance runs. The message says which unit and why."""


@dataclass(frozen=True)
class MoveOutcome:
    """How a move ended: ``moved`` (``target`` decodes it now) or not (``reason``; it went on at
    ``source`` unless that unit died or the request ended)."""

    request_id: str
    source: str
    target: str
    moved: bool
    reason: str = ""
    num_bytes: int = 0  # KV bytes that moved (the target's count: every page of every layer and rank)
    num_output_tokens: int = 0  # the tokens it had when it left the source


@dataclass(frozen=True)
class DrainReport:
    """What `Router.drain` did: the moves' outcomes, and the requests the unit still held at the end
    (none when it drained in time; a request that did not move goes on there). ``routed``: whether
    routing picks the unit again (a drain that did not empty it undoes itself)."""

    unit: str
    moves: list[MoveOutcome]
    remaining: list[str]
    routed: bool = False

    @property
    def drained(self) -> bool:
        """Whether the unit holds no request."""
        return not self.remaining


@dataclass
class Move:
    """One move in flight."""

    request_id: str
    source: str
    target: str
    outcome: Future[MoveOutcome] = field(default_factory=Future)
    moved_in: bool = False  # the target said its KV landed and it decodes it
    num_bytes: int = 0
    num_output_tokens: int = 0
    target_down: bool = False  # the target died (or became unreachable) before the source's end was read
    target_fate: str = "died"  # what happened to it, for the request's error
    source_ended: bool = False  # the source's end (moved) was read before the target's news
    held: list[Tokens] = field(default_factory=list)  # the target's tokens until the source's end is read

    def end(self, moved: bool, reason: str = "") -> None:
        """Resolve the move's outcome (once)."""
        if not self.outcome.done():
            self.outcome.set_result(MoveOutcome(self.request_id, self.source, self.target, moved, reason,
                                                self.num_bytes if moved else 0,
                                                self.num_output_tokens if moved else 0))


class RequestMoves:
    """Moves in flight by request id, and the units being drained (routing skips them)."""

    def __init__(self) -> None:
        self.moves: dict[str, Move] = {}
        self.draining: set[str] = set()

    def start(self, request_id: str, source: str, target: str) -> Move:
        """Record a move asked of ``source``."""
        move = self.moves[request_id] = Move(request_id, source, target)
        return move

    def get(self, request_id: str) -> Move | None:
        return self.moves.get(request_id)

    def pop(self, request_id: str) -> Move | None:
        return self.moves.pop(request_id, None)

    def to(self, target: str) -> list[Move]:
        """The moves in flight to ``target``."""
        return [m for m in self.moves.values() if m.target == target]

    def from_(self, source: str) -> list[Move]:
        """The moves in flight from ``source``."""
        return [m for m in self.moves.values() if m.source == source]
