"""What an instance unit tells the others about itself, and the frame counters both sides keep.

A *unit* is one engine with its messenger: an instance, or one data-parallel group of it (each
dp group holds its own requests' KV, so it talks to peers on its own). The launcher collects a
`UnitInfo` from every unit once they are ready and hands the list to all of them; nothing in it
is ever unpickled (msgspec, typed).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

PEER_ID_SEPARATOR = "#"


@dataclass(frozen=True)
class PeerId:
    """A unit *incarnation*: its name and the id drawn when its process started.

    A restarted unit has the same name and a new incarnation, so it is a new peer: frames and
    grants of the old process never match it. On the wire it is ``"name#incarnation"`` (`str`);
    `parse` is the one place that reads it back.
    """

    name: str
    incarnation: str

    def __str__(self) -> str:
        return f"{self.name}{PEER_ID_SEPARATOR}{self.incarnation}"

    @classmethod
    def parse(cls, text: str) -> PeerId:
        """The `PeerId` written as ``text``; a text without the separator is a name with no incarnation."""
        name, sep, incarnation = text.rpartition(PEER_ID_SEPARATOR)
        return cls(name, incarnation) if sep else cls(text, "")


class UnitInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One unit as its peers see it."""

    name: str  # "prefill-0", "decode-1", or "decode-0.dp1" for a dp group
    instance: str  # the plan's instance name (routes are between instances)
    role: str  # "prefill" | "decode" | "mixed"
    incarnation: str  # fresh per process start: a restarted unit is a new peer
    address: bytes  # transfer-engine endpoint address
    pool_regions: list[bytes]  # serialized descriptor of each tp rank's KV pool, in tp order
    context_region: bytes  # serialized descriptor of the context buffer (decode: slots to write into)
    context_slot_bytes: int
    num_context_slots: int

    @property
    def peer_id(self) -> PeerId:
        """This incarnation of the unit."""
        return PeerId(self.name, self.incarnation)


class FrameCounters:
    """Control frames dropped, by reason; a rejected frame is counted, never raised."""

    def __init__(self) -> None:
        self.by_reason: dict[str, int] = {}

    def count(self, reason: str) -> None:
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())
