"""A unit on a Ray node: the actor that holds the unit's placement-group bundle, and the unit
process it starts there (``python -m disaggsdk.launch.launcher.ray_unit_host``).

The unit is a child process of the actor rather than the actor itself: it runs exactly the code a
local unit runs (`launch.unit_process.unit.serve_unit`: its own log file, signals, ``os._exit`` on failure),
which a Ray worker process must not be put through. It stops with the actor (PDEATHSIG as
SIGTERM, and `launch.unit_process.launcher_lease` watching its parent), so ``ray.kill`` of the actor, or Ray
killing the actors of a dead driver, ends the unit and its tp workers, its /dev/shm file removed.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import msgspec

if TYPE_CHECKING:
    from ray import ObjectRef

Result = TypeVar("Result")

TOKEN_BYTES = 32
KEEPALIVE_IDLE_S = 5  # a driver on a lost machine is noticed in ~idle + interval * count seconds
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_COUNT = 5


class UnitStart(msgspec.Struct, frozen=True):
    """What the actor pipes to the unit process: its args and where the driver waits for it."""

    args: bytes  # msgpack of `launch.messages.UnitArgs`
    driver_host: str
    driver_port: int
    token: bytes


@dataclass(frozen=True)
class UnitStarted:
    """Where the actor started its unit process (`UnitHost.start`'s answer)."""

    pid: int  # on its node
    node_id: str  # its Ray node
    address: str  # its node's IP


def keepalive(sock: socket.socket) -> None:
    """TCP keepalive on a runtime channel: a peer whose machine vanished (no FIN) is found dead."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if sys.platform == "linux":  # units run on Linux only (memfd pools); elsewhere the timing options differ
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_COUNT)


class UnitHost:
    """The actor side (`unit_host_actor` makes it a Ray actor class): starts, watches and reaps one
    unit process on this node."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, payload: bytes) -> UnitStarted:
        """Start the unit process with ``payload`` (msgpack `UnitStart`) on its stdin.

        Returns:
            its pid (on this node), this node's id and IP.
        """
        import ray

        self._proc = subprocess.Popen([sys.executable, "-m", "disaggsdk.launch.launcher.ray_unit_host"], stdin=subprocess.PIPE)
        assert self._proc.stdin is not None
        self._proc.stdin.write(payload)
        self._proc.stdin.close()
        ctx = ray.get_runtime_context()
        address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # ray: untyped
        return UnitStarted(self._proc.pid, ctx.get_node_id(), address)

    def alive(self) -> bool:
        """Whether the unit process is running."""
        return self._proc is not None and self._proc.poll() is None

    def join(self, timeout_s: float | None) -> int | None:
        """Wait up to ``timeout_s`` for the unit to exit; its exit code (negative: the signal), or
        None while it runs. A unit that did not exit cleanly has its libfabric shm files removed
        here, on its own node."""
        from disaggsdk.transfer.shm_files import remove_fabric_shm

        if self._proc is None:
            return None
        try:
            code = self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None
        if code != 0:
            remove_fabric_shm(self._proc.pid)
        return code

    def log_tail(self, path: str) -> str:
        """The last lines of the unit's log, on this node."""
        from disaggsdk.launch.launcher.units import log_tail

        return log_tail(path)

    def kill(self) -> None:
        """SIGKILL the unit process (its tp workers follow it)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()


class RemoteMethod(Protocol[Result]):
    """One method of an actor handle: ``.remote(...)`` calls it on the actor."""

    def remote(self, *args: object) -> ObjectRef[Result]:
        """Call the method on the actor; `ray.get` the reference for its result."""


class UnitHostActor(Protocol):
    """A handle of a `UnitHost` actor, as Ray presents it (its stub does not map a class's methods)."""

    @property
    def start(self) -> RemoteMethod[UnitStarted]: ...
    @property
    def alive(self) -> RemoteMethod[bool]: ...
    @property
    def join(self) -> RemoteMethod[int | None]: ...
    @property
    def log_tail(self) -> RemoteMethod[str]: ...


class UnitHostActorClass(Protocol):
    """`UnitHost` as a Ray actor class: ``.options(...)`` for a placement, ``.remote()`` to start one."""

    def options(self, **options: object) -> UnitHostActorClass:
        """The same class with Ray options (scheduling strategy, resources)."""

    def remote(self) -> UnitHostActor:
        """Start an actor; its handle."""


def unit_host_actor() -> UnitHostActorClass:
    """`UnitHost` as a Ray actor class (no CPU of its own: the bundle's resources are asked per actor)."""
    import ray

    remote = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)  # type: ignore[call-overload]  # ray's stub lacks max_concurrency
    actor_class: UnitHostActorClass = remote(UnitHost)
    return actor_class


def kill_actor(actor: UnitHostActor) -> None:
    """End ``actor`` for good (``ray.kill``, no restart): the unit process dies with it."""
    import ray

    ray.kill(actor, no_restart=True)  # type: ignore[arg-type]  # ray's stub names the handle ActorHandle


def main() -> None:
    """The unit process: read `UnitStart`, connect to the driver, send the token, serve."""
    from disaggsdk.launch import messages as ch
    from disaggsdk.launch.channel import FrameChannel
    from disaggsdk.launch.unit_process.unit import serve_unit
    # serve_unit's `LauncherLease` sees the actor (its parent) go and closes the unit
    start = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=UnitStart)
    args = msgspec.msgpack.decode(start.args, type=ch.UnitArgs)
    for directory in (os.path.dirname(args.log_path), args.work_dir):  # on another machine they are new
        os.makedirs(directory, exist_ok=True)
    sock = socket.create_connection((start.driver_host, start.driver_port), timeout=60)
    keepalive(sock)
    sock.sendall(start.token)
    serve_unit(FrameChannel(sock, ch.TO_UNIT), args)


if __name__ == "__main__":
    main()
