"""Changing how many units prefill and how many decode, live (`Router` + `launch.unit_process.role_switch`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disaggsdk.serve.moves.request_moves import LeverConflict, MoveError, MoveOutcome
from disaggsdk.serve.routing.unit_routability import UnitRoutability
from disaggsdk.spec.rules import role_change_problem

if TYPE_CHECKING:
    from disaggsdk.serve.backend import LaunchedUnits

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


def plan_changes(roles: dict[str, str], load: dict[str, int], prefill: int, decode: int,
                 routability: UnitRoutability | None = None) -> list[tuple[str, str]]:
    """Which units change, to which role, for ``prefill`` prefill and ``decode`` decode units: the last
    healthy prefill units by name when prefill units are too many; when decode units are, the healthy
    decode units routing skips first (drained), then the least loaded. A unit that is down keeps its
    role and counts in it (it comes back in it).

    Args:
        roles: each prefill or decode unit's current role (mixed units are left out).
        load: requests each unit holds now.
        routability: which units are healthy and routable (None: all of them).
    Raises:
        MoveError: the counts do not add up to the units there are, or leave no decode unit.
        LeverConflict: the layout needs a unit that is down to change role, or it would leave no routable
            decode unit (or no routable prefill unit where ``prefill`` asks for one).
    """
    units = sorted(roles)
    if prefill < 0 or decode < 1 or prefill + decode != len(units):
        raise MoveError(f"{prefill} prefill + {decode} decode units asked; this deployment has {len(units)} prefill "
                        f"and decode units in all, and at least one must decode")
    r = routability or UnitRoutability(roles, frozenset(units), frozenset())
    have = {role: [u for u in units if roles[u] == role] for role in ("prefill", "decode")}
    extra = len(have["prefill"]) - prefill
    if extra == 0:
        return []
    leaving_role, after = ("prefill", "decode") if extra > 0 else ("decode", "prefill")
    num_leaving = abs(extra)
    healthy = [u for u in have[leaving_role] if u in r.healthy]
    if leaving_role == "prefill":
        leaving = healthy[len(healthy) - num_leaving:] if len(healthy) >= num_leaving else healthy
    else:
        leaving = sorted(healthy, key=lambda u: (r.is_routable(u), load.get(u, 0), u))[:num_leaving]
    layout = f"{prefill} prefill + {decode} decode"
    if len(leaving) < num_leaving:
        down = [r.why_not(u) for u in have[leaving_role] if u not in r.healthy]
        raise LeverConflict(f"{layout} needs {num_leaving} {leaving_role} unit(s) to turn {after}, and only "
                            f"{len(healthy)} can ({', '.join(down)}); ask again once it is back, or for a layout "
                            f"that keeps it {leaving_role}")
    if (leaving_role == "decode" or prefill > 0) and not any(
            r.is_routable(u) for u in have[leaving_role] if u not in leaving):
        why = [r.why_not(u) for u in have[leaving_role] if u not in leaving]
        raise LeverConflict(f"{layout} would turn {', '.join(leaving)} {after}, the last routable {leaving_role} "
                            f"unit(s), and leave {', '.join(why) or 'none'} to {leaving_role}; ask for a layout "
                            f"that keeps one, or undrain or restart one first")
    return [(u, after) for u in leaving]


def rebalance(router: LaunchedUnits, prefill: int, decode: int, drain_timeout_s: float = 60.0) -> RebalanceReport:
    """Turn units around until ``prefill`` of them prefill and ``decode`` decode (see the module doc).
    One runs at a time: a call while another runs is refused at once rather than queued, as its layout
    was chosen from roles the running one is changing.

    Raises:
        MoveError: the spec's units cannot change role (prefill and decode of different shapes, ep), or the
            counts are impossible.
        LeverConflict: another rebalance runs, or the layout cannot be reached with healthy units without
            leaving a role no routable unit (`plan_changes`).
    """
    problem = role_change_problem(router.spec)
    if problem is not None:
        raise MoveError(f"units of this deployment cannot change role: {problem}")
    if not router.rebalancing.acquire(blocking=False):
        raise LeverConflict("another rebalance is running; ask again once it has answered (GET /health shows the "
                            "roles it left)")
    try:
        return _rebalance(router, prefill, decode, drain_timeout_s)
    finally:
        router.rebalancing.release()


def _rebalance(router: LaunchedUnits, prefill: int, decode: int, drain_timeout_s: float) -> RebalanceReport:
    routability = router.routability()
    roles = {u: r for u, r in routability.roles.items() if r in ("prefill", "decode")}
    changes = plan_changes(roles, {u: router.num_in_flight(u) for u in roles}, prefill, decode, routability)
    report = []
    for unit, after in changes:
        start_s = time.monotonic()
        moves: list[MoveOutcome] = []
        was_drained = unit in routability.draining
        if after == "prefill":  # its requests go to the other decode units first, with their KV
            try:  # refused if the other decode units went down or were drained since the plan
                drained = router.drain(unit, drain_timeout_s)
            except MoveError as exc:
                report.append(RoleChange(unit, roles[unit], after, False, str(exc), time.monotonic() - start_s))
                continue
            moves = drained.moves
            if not drained.drained:  # the drain undid itself: it is routed as before
                report.append(RoleChange(unit, roles[unit], after, False,
                                         f"{len(drained.remaining)} request(s) did not move off it in "
                                         f"{drain_timeout_s:g} s; it goes on decoding", time.monotonic() - start_s,
                                         moves))
                continue
        elif prefill > 0:  # a prefill unit that went down since the plan may have been the one staying
            now = router.routability()
            if not any(now.is_routable(u) for u, r in now.roles.items()
                       if r == "prefill" and u != unit and u not in dict(changes)):
                report.append(RoleChange(unit, roles[unit], after, False,
                                         f"it is the last routable prefill unit now: {now.role_refusal('prefill', unit)}",
                                         time.monotonic() - start_s))
                continue
        try:
            reason = router.switch_role(unit, after).result(SWITCH_TIMEOUT_S)
        except TimeoutError:
            reason = f"no answer within {SWITCH_TIMEOUT_S:g} s"
        except MoveError as exc:  # it is changing role already (an autoscaler's switch)
            reason = str(exc)
        if reason and after == "prefill" and not was_drained:
            router.undrain(unit)  # it stays a decode unit: route to it again
        elif not reason and after == "decode":
            # every unit reads its channel in order: once all answered for stats, all know its new role (the
            # prefill units accept its requests); only then is it routed
            router.unit_stats()
            router.undrain(unit)
        report.append(RoleChange(unit, roles[unit], after, not reason, reason, time.monotonic() - start_s, moves))
    return RebalanceReport(report, router.unit_roles())
