"""Which units routing may pick now, role by role, and why a role has none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from disaggsdk.launch.base import LaunchError
from disaggsdk.serve.routing.unit_routing import SERVING_ROLES

# what a client refused for want of a routable unit is told to wait: a unit restarts, a stalled one speaks
# again or a role switch completes in seconds; an operator's undrain may take longer, and the client asks again
RETRY_AFTER_S = 5


class NoRoutableUnitError(LaunchError):
    """No serving unit can take a request now (each is down or drained); one may again after
    ``retry_after_s`` (a restart, a unit heard again, an undrain). HTTP 503 with ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: float = RETRY_AFTER_S):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class UnitRoutability:
    """The units' roles, which are healthy and which are drained, at one moment.

    Attributes:
        roles: each unit's role ("prefill", "decode", "mixed") by name.
        healthy: the units `Runtime.is_healthy` says are.
        draining: the units routing skips (`Router.drain`, a unit that just turned decode).
    """

    roles: Mapping[str, str]
    healthy: frozenset[str]
    draining: frozenset[str]

    def is_routable(self, unit: str) -> bool:
        """Whether routing may pick ``unit`` (a prefill unit: whether decode units may ask it)."""
        return unit in self.healthy and unit not in self.draining

    def routable(self, role: str) -> list[str]:
        """The routable units of ``role``, by name."""
        return sorted(u for u, r in self.roles.items() if r == role and self.is_routable(u))

    def why_not(self, unit: str) -> str:
        """Why ``unit`` is not routable: "decode-1 is down", "decode-0 is drained (...)"."""
        if unit not in self.healthy:
            return f"{unit} is down"
        return f"{unit} is drained (POST /units/{unit}/undrain routes it again)"

    def role_refusal(self, role: str, leaving: str | None = None) -> str | None:
        """Why ``role`` has no routable unit (with ``leaving`` out of routing too), or None when it has one
        (or has no unit at all: a layout of no prefill unit is no fault)."""
        units = sorted(u for u, r in self.roles.items() if r == role)
        if not units or any(self.is_routable(u) for u in units if u != leaving):
            return None
        why = [f"{u} would leave routing" if u == leaving else self.why_not(u) for u in units]
        if not any(u in self.healthy for u in units):  # nothing an operator undoes: units died or went silent
            return f"no {role} unit is healthy: {', '.join(why)} (runtime.failures and the units' logs say why)"
        return f"no {role} unit is routable: {', '.join(why)}"

    def reasons(self) -> list[str]:
        """What keeps the deployment from full health, for /health: one line per role with no routable
        unit, then one per unit down in a role that still has one."""
        roles = sorted(set(self.roles.values()))
        empty = [line for role in roles if (line := self.role_refusal(role)) is not None]
        empty_roles = {role for role in roles if self.role_refusal(role) is not None}
        down = [f"{u} is down" for u, r in sorted(self.roles.items()) if u not in self.healthy and r not in empty_roles]
        return empty + down

    def can_serve(self) -> bool:
        """Whether a request can be routed now: some serving (decode or mixed) unit is routable."""
        return any(self.routable(role) for role in SERVING_ROLES)

    def no_serving_unit(self) -> str:
        """What a request refused for want of a routable serving unit is told."""
        lines = [line for role in SERVING_ROLES if (line := self.role_refusal(role)) is not None]
        return "; ".join(lines) or "no decode unit is routable"
