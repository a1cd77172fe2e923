"""Changing how many units prefill and how many decode, live (`Router` + `launch.role_switch`).

``rebalance(router, prefill=2, decode=1)`` turns units around until the deployment has that many of
each: prefill units become decode units first (capacity to take requests comes before capacity
leaves), then decode units become prefill units, the least loaded first. A decode unit leaving
decode is drained: out of routing, its decoding requests moved to the other decode units with their
KV (`Router.drain`), the ones still waiting for their KV moved as soon as they decode; only then is
it asked to switch. A prefill unit leaving prefill refuses new prefill requests at once (decode
units retry them elsewhere) and switches once its jobs drained. No request fails on the way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disaggsdk.serve.request_moves import MoveError, MoveOutcome
from disaggsdk.spec.rules import role_change_problem

if TYPE_CHECKING:
    from disaggsdk.serve.router import Router

SWITCH_TIMEOUT_S = 60.0  # a unit with nothing in flight switches in milliseconds; a prefill unit's jobs drain first


@dataclass(frozen=True)
class RoleChange:
    """One unit's change: from ``before`` to ``after`` (``done`` False: it stayed, ``reason`` says why)."""

    unit: str
    before: str
    after: str
    done: bool
    reason: str = ""
    seconds: float = 0.0  # from the first step (drain or switch) to the answer
    moves: list[MoveOutcome] = field(default_factory=list)  # the requests its drain moved


@dataclass(frozen=True)
class RebalanceReport:
    """What `rebalance` did, and the roles after it."""

    changes: list[RoleChange]
    roles: dict[str, str]

    @property
    def done(self) -> bool:
        """Whether every change asked for happened."""
        return all(c.done for c in self.changes)


def plan_changes(roles: dict[str, str], load: dict[str, int], prefill: int, decode: int) -> list[tuple[str, str]]:
    """Which units change, to which role, for ``prefill`` prefill and ``decode`` decode units: the last
    prefill units by name when prefill units are too many, the least loaded decode units when decode
    units are.

    Args:
        roles: each prefill or decode unit's current role (mixed units are left out).
        load: requests each unit holds now.
    Raises:
        MoveError: the counts do not add up to the units there are, or leave no decode unit.
    """
    units = sorted(roles)
    if prefill < 0 or decode < 1 or prefill + decode != len(units):
        raise MoveError(f"{prefill} prefill + {decode} decode units asked; this deployment has {len(units)} prefill "
                        f"and decode units in all, and at least one must decode")
    have_prefill = [u for u in units if roles[u] == "prefill"]
    have_decode = [u for u in units if roles[u] == "decode"]
    extra = len(have_prefill) - prefill
    if extra > 0:
        return [(u, "decode") for u in have_prefill[-extra:]]
    leaving = sorted(have_decode, key=lambda u: (load.get(u, 0), u))[:-extra] if extra < 0 else []
    return [(u, "prefill") for u in leaving]


def rebalance(router: Router, prefill: int, decode: int, drain_timeout_s: float = 60.0) -> RebalanceReport:
    """Turn units around until ``prefill`` of them prefill and ``decode`` decode (see the module doc).

    Raises:
        MoveError: the spec's units cannot change role (prefill and decode of different shapes, ep), or the
            counts are impossible.
    """
    problem = role_change_problem(router.spec)
    if problem is not None:
        raise MoveError(f"units of this deployment cannot change role: {problem}")
    roles = {u: r for u, r in router.unit_roles().items() if r in ("prefill", "decode")}
    changes = plan_changes(roles, {u: router.num_in_flight(u) for u in roles}, prefill, decode)
    report = []
    for unit, after in changes:
        start_s = time.monotonic()
        moves: list[MoveOutcome] = []
        if after == "prefill":  # its requests go to the other decode units first, with their KV
            drained = router.drain(unit, drain_timeout_s)
            moves = drained.moves
            if not drained.drained:
                router.undrain(unit)
                report.append(RoleChange(unit, roles[unit], after, False,
                                         f"{len(drained.remaining)} request(s) did not move off it in "
                                         f"{drain_timeout_s:g} s; it goes on decoding", time.monotonic() - start_s,
                                         moves))
                continue
        try:
            reason = router.switch_role(unit, after).result(SWITCH_TIMEOUT_S)
        except TimeoutError:
            reason = f"no answer within {SWITCH_TIMEOUT_S:g} s"
        if reason and after == "prefill":
            router.undrain(unit)  # it stays a decode unit: route to it again
        elif not reason and after == "decode":
            # every unit reads its channel in order: once all answered for stats, all know its new role (the
            # prefill units accept its requests); only then is it routed
            router.unit_stats()
            router.undrain(unit)
        report.append(RoleChange(unit, roles[unit], after, not reason, reason, time.monotonic() - start_s, moves))
    return RebalanceReport(report, router.unit_roles())
