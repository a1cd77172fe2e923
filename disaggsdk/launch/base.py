"""The launch contract, both of its seams, and the launch errors.

The router's seam: a `Runtime` starts the units of a plan, carries typed messages to them
(`launch.messages`, framed by `launch.channel`), hands back what they say, tells who died
(`UnitDown`) and who went quiet (`UnitStalled`, `UnitUnreachable`), and stops
them. It knows processes, never requests: which unit serves a request, what a token means and what
a client is owed live in the router (`disaggsdk.serve.routing.router`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.launch.channel import FrameChannel
    from disaggsdk.launch.messages import FromUnit, ToUnit, UnitArgs
    from disaggsdk.messenger.peers import UnitInfo
    from disaggsdk.plan import Plan
    from disaggsdk.spec.types import Spec


class LaunchError(DisaggError):
    """A deployment that cannot be started as asked."""


class UnitCannotRun(LaunchError):
    """A unit found this machine unfit for it before building anything (no CUDA device): the message,
    one line, is the whole report and says what to do; nothing in the unit's log adds to it."""


class ChannelClosed(LaunchError):
    """The other end closed the channel (its process exited or died)."""


class ChannelError(LaunchError):
    """A frame that cannot be read: wrong protocol version, absurd size, or not a known message."""


class UnitProcess(Protocol):
    """The process of one unit, as the runtime sees it (a `multiprocessing` child, or a Ray actor's)."""

    @property
    def pid(self) -> int:
        """Its pid on this host; -1 where no process here has it (a unit on another machine)."""

    @property
    def sentinel(self) -> int | None:
        """A descriptor that becomes readable when it exits; None where none exists here (its
        channel closing says it died)."""

    @property
    def exitcode(self) -> int | None:
        """Its exit code (negative: the signal) once joined; None while it runs."""

    def is_alive(self) -> bool:
        """Whether it runs."""

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for it to exit."""

    def kill(self) -> None:
        """SIGKILL it (its tp workers follow)."""

    def log_tail(self, path: str) -> str:
        """The last lines of its log at ``path``, read where it runs."""


@dataclass
class UnitHandle:
    """The runtime's view of one unit: its args, its process, and its channel."""

    args: UnitArgs
    process: UnitProcess
    channel: FrameChannel[FromUnit]  # the runtime's end of the unit's socket
    info: UnitInfo | None = None  # once Ready
    healthy: bool = True
    started: bool = False
    fatal: str | None = None
    exit_report: str | None = None
    stopped_with_group: bool = False  # killed by the runtime because a rank of its lock-step dp group died
    # its step's compile as it last said (`messages.Progress`): None (it does not compile), "compiling"
    # (in the background: it serves eagerly meanwhile), "compiled" or "compile_failed"
    compile_stage: str | None = None


class Launcher(Protocol):
    """Where and how a runtime's units start: the one thing that varies between running them as
    local processes and as Ray actors.

    Lifecycle: ``start(plan)`` once (reserve room: a Ray cluster joined, placement groups placed),
    ``spawn(args)`` per unit start and restart, ``close()`` after the units stopped.
    """

    def provider_for(self, plan: Plan, provider: str) -> str:
        """The libfabric provider units use when the spec asks for ``provider`` (shm cannot cross machines)."""

    def start(self, plan: Plan) -> None:
        """Get ready to spawn ``plan``'s units.

        Raises:
            LaunchError: there is no room for the plan.
        """

    def spawn(self, args: UnitArgs) -> UnitHandle:
        """Start one unit and return its handle: its channel connected, its `UnitArgs` delivered.

        Raises:
            LaunchError: the unit could not be started where the plan places it.
        """

    def placement(self) -> dict[str, str]:
        """Unit name -> where it runs, when units run beyond this machine (else {})."""

    def close(self) -> None:
        """Free what the launcher holds, after the units stopped (also after a failed or no start). Idempotent."""


# the router's seam: what `serve.routing.router.Router` needs of whatever runs the units (plain dataclasses:
# in-process notices, never on a channel, and `import disaggsdk.launch` stays free of msgspec)

@dataclass(frozen=True)
class UnitStalled:
    """The runtime's own notice (never on a unit's channel): nothing was heard from a live unit for
    ``silent_s`` (`$.serve.unit_stall_s` or more), so it reads unhealthy until it speaks again."""

    silent_s: float


@dataclass(frozen=True)
class UnitUnreachable:
    """The runtime's own notice (never on a unit's channel): nothing at all, not even the unit's
    heartbeat, was heard from a live unit for ``silent_s`` (`$.serve.unit_unreachable_s` or more): its
    link is cut or its process frozen. It reads unhealthy until it is heard again."""

    silent_s: float


# on_message(unit name, one `launch.messages` unit -> runtime message, or a `UnitStalled` or
# `UnitUnreachable` notice), from the runtime's reader
MessageListener = Callable[[str, "FromUnit | UnitStalled | UnitUnreachable"], None]


@dataclass(frozen=True)
class UnitDown:
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
