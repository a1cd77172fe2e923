"""The Runtime seam: what the router (`disaggsdk.serve.routing.router`) needs of whatever runs the units.

A runtime starts the units of a plan, carries typed messages to them (`launch.messages`, framed
by `launch.channel`), hands back what they say, tells who died, and stops them. It knows
processes, never requests: which unit serves a request, what a token means and what a client is
owed live in the router. The implementation is `launch.runtime.Supervisor`, whose `base.Launcher`
places the units (on this machine: `LocalRuntime`; on a Ray cluster: `RayRuntime`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import msgspec

from disaggsdk.launch.messages import FromUnit, ToUnit

if TYPE_CHECKING:
    from disaggsdk.spec.types import Spec


class UnitStalled(msgspec.Struct, frozen=True):
    """The runtime's own notice (never on a unit's channel): nothing was heard from a live unit for
    ``silent_s`` (`serve.unit_stall_s` or more), so it reads unhealthy until it speaks again."""

    silent_s: float


class UnitUnreachable(msgspec.Struct, frozen=True):
    """The runtime's own notice (never on a unit's channel): nothing at all, not even the unit's
    heartbeat, was heard from a live unit for ``silent_s`` (`serve.unit_unreachable_s` or more): its
    link is cut or its process frozen. It reads unhealthy until it is heard again."""

    silent_s: float


# on_message(unit name, one `launch.messages` unit -> runtime message, or a `UnitStalled` or
# `UnitUnreachable` notice), from the runtime's reader
MessageListener = Callable[[str, FromUnit | UnitStalled | UnitUnreachable], None]
class UnitDown(msgspec.Struct, frozen=True):
    """A unit died: how (``report``, with its log tail), and whether it was only collateral: stopped
    by the runtime because another rank of its lock-step dp group died (engine.dp_lockstep), so
    nothing it held is suspected of having killed it."""

    report: str
    collateral: bool = False


# on_unit_down(unit name, how it went down), from the runtime's reader
DownListener = Callable[[str, UnitDown], None]


class Runtime(Protocol):
    """The units of one deployment, started and supervised."""

    spec: Spec  # the spec the units run (after `tiny_spec` where asked)
    model_name: str
    failures: list[str]  # one report per unit that died

    def unit_roles(self) -> dict[str, str]:
        """Every unit's role by name ("prefill" | "decode" | "mixed"), in start order."""

    def is_healthy(self, unit: str) -> bool:
        """Whether ``unit`` is alive, has not been reported down, and is neither stalled
        (`UnitStalled`) nor unreachable (`UnitUnreachable`)."""

    def may_recover(self, unit: str) -> bool:
        """Whether ``unit`` is healthy or may be again (a restart pending or left)."""

    def listen(self, on_message: MessageListener, on_unit_down: DownListener) -> None:
        """Start delivering the units' messages and deaths (once; from one reader thread)."""

    def send(self, unit: str, message: ToUnit) -> bool:
        """Send one message to ``unit``; False when it is down (the message is dropped)."""

    def placement(self) -> dict[str, str]:
        """Unit name -> where it runs, when units run beyond this machine (Ray); else {}."""

    def compile_stages(self) -> dict[str, str | None]:
        """Each unit's step compile as it last said: None (none), "compiling", "compiled", "compile_failed"."""

    def wait_until_compiled(self, timeout_s: float) -> dict[str, str | None]:
        """Block until no unit is still compiling its step (or ``timeout_s`` passed); `compile_stages`."""

    def close(self) -> None:
        """Stop every unit and leave nothing behind. Idempotent."""
