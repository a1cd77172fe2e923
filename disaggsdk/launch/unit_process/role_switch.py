"""A unit changing role live (prefill <-> decode): same process, weights, pools, transfer engine and
registrations; a messenger of the new role on top.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.launch.messages import UnitArgs
    from disaggsdk.launch.unit_process.parts import UnitParts
    from disaggsdk.plan import Plan
    from disaggsdk.spec.types import Spec

SWITCHABLE_ROLES = ("prefill", "decode")


class RoleChangeError(DisaggError):
    """A unit cannot take the role asked of it (colocated, host-mirrored KV, an unknown role)."""


def check_switch(parts: UnitParts, role: str) -> None:
    """Whether ``parts`` can ever serve ``role`` (checked when the switch is asked).

    Raises:
        RoleChangeError: a colocated unit, KV staged through host mirrors, or not a prefill/decode role.
    """
    if role not in SWITCHABLE_ROLES:
        raise RoleChangeError(f"a unit switches to one of {', '.join(SWITCHABLE_ROLES)}, not {role!r}")
    if parts.kv is None or parts.messenger is None:
        raise RoleChangeError(f"{parts.info.name} is colocated (one engine, no messenger): it has no other role")
    if parts.kv.staging is not None:
        raise RoleChangeError(f"{parts.info.name} stages its KV through host mirrors (transport.kv_staging: host); "
                              "role changes are not supported there yet")


def still_busy(parts: UnitParts) -> str | None:
    """What keeps ``parts`` in its current role now (None: nothing, it may switch)."""
    from disaggsdk.messenger.decode_side import DecodeMessenger

    engine, m = parts.engine, parts.messenger
    if engine.has_unfinished() or engine.kv.suspended:
        return f"{len(engine.scheduler.running) + len(engine.scheduler.waiting)} request(s) in its engine"
    if isinstance(m, DecodeMessenger) and not m.settled:
        return "KV handoffs, moves or quarantined grants in flight"
    if m is not None and m.busy:
        return "prefill jobs whose writes are in flight"
    return None


def switch_role(parts: UnitParts, args: UnitArgs, spec: Spec, plan: Plan, role: str) -> UnitParts:
    """The parts of the unit serving ``role`` from now on (``parts`` is spent). Call only when
    `still_busy` is None.

    Raises:
        RoleChangeError: see `check_switch`.
    """
    from disaggsdk.launch.unit_process.parts import DecodeParts, PrefillParts

    check_switch(parts, role)
    kv, old = parts.kv, parts.messenger
    assert kv is not None and old is not None, "checked above"
    codec = old.codec
    old.close()  # nothing is in flight: a decode messenger's quarantine is empty, a prefill streamer idle
    parts.engine.switch_role(role)
    # a decode unit is written into under its whole-region keys unless grant keys open each grant alone
    kv.reregister(remote_write=role == "decode" and not spec.transport.grant_keys_on(args.provider))
    kv.info = msgspec.structs.replace(kv.info, role=role)
    messenger = (kv.prefill_messenger(args, spec, plan, codec) if role == "prefill"
                 else kv.decode_messenger(args, spec, plan, codec))
    # its counters go on (a Prometheus counter only grows): the same records, counted into by the new side
    messenger.totals.counters, messenger.frames, messenger.rejected = old.totals.counters, old.frames, old.rejected
    return kv.parts(PrefillParts if role == "prefill" else DecodeParts, messenger)
