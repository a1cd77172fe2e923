"""The launch contract: what a launcher gives the runtime, and the launch errors.

The runtime (`launch.runtime.Supervisor`) supervises units the same way wherever they run:
handshake, reader thread, failure reports, restarts, clean close. What varies is the `Launcher`
that starts a unit (`units.ProcessLauncher`: a child process here; `ray_launcher.RayLauncher`:
a Ray actor's child on a cluster node) and the `UnitProcess` handle it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.launch.channel import FrameChannel
    from disaggsdk.launch.messages import FromUnit, UnitArgs
    from disaggsdk.messenger.peers import UnitInfo
    from disaggsdk.plan import Plan


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
