"""The shared KV store a deployment's units read and write pages in: a ``redis-server`` (or
``valkey-server``) process on loopback, memory only, evicting least recently used entries.

No persistence (``--save "" --appendonly no``): the store is a cache, and a page lost with it is
computed again. `start_kv_store` returns once the server answers PING; `KVStoreServer.stop` ends it.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from disaggsdk.launch.base import LaunchError

SERVER_BINARIES = ("redis-server", "valkey-server")  # the first one on PATH is started
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
MAX_PORT_TRIES = 3  # a free port picked by us may be taken before the server binds it


class KVStoreServerError(LaunchError):
    """The KV store server cannot start: no server binary, a bad argument, or it exited (the message has its log)."""


class KVStoreServer:
    """A running store server process; stops on `stop` or on leaving a ``with`` block.

    Attributes:
        address: ``"host:port"`` it listens on (`kv.tiers.store_tier.StoreTier` takes it).
        maxmemory_bytes: the memory it holds entries in before evicting the least recently used.
    """

    def __init__(self, process: subprocess.Popen[bytes], host: str, port: int, maxmemory_bytes: int, work_dir: str):
        self.process = process
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self.maxmemory_bytes = maxmemory_bytes
        self._work_dir = work_dir

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self.process.poll() is None

    def stop(self) -> None:
        """Terminate the server (kill it after `STOP_TIMEOUT_S`) and remove its directory; idempotent."""
        self.end_process()
        shutil.rmtree(self._work_dir, ignore_errors=True)

    def end_process(self) -> None:
        """Terminate the server process, and kill it when it is still there after `STOP_TIMEOUT_S`;
        its directory (the log) stays until `stop`."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> KVStoreServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def server_binary() -> str:
    """The path of the first of `SERVER_BINARIES` on PATH.

    Raises:
        KVStoreServerError: none is installed (with the command that installs one).
    """
    for name in SERVER_BINARIES:
        path = shutil.which(name)
        if path:
            return path
    raise KVStoreServerError("the shared KV store needs redis-server (or valkey-server) on PATH: "
                             "apt-get install redis-server (Debian/Ubuntu; `make sysdeps-test` does it)")


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _server_pid(host: str, port: int) -> int | None:
    """The process id of the server answering on ``host:port`` (its INFO), or None when none answers
    PING yet: a server on a port taken by another one would otherwise look started."""
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\nINFO server\r\n")
            reply = b""
            while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                chunk = s.recv(65536)
                if not chunk:
                    return None
                reply += chunk
    except OSError:
        return None
    if not reply.startswith(b"+PONG"):
        return None
    match = re.search(rb"process_id:(\d+)", reply)
    return int(match.group(1)) if match else None


def start_kv_store(maxmemory_bytes: int, port: int | None = None, host: str = "127.0.0.1") -> KVStoreServer:
    """Start a store server and wait until it answers PING.

    Args:
        maxmemory_bytes: memory for entries; beyond it the server evicts the least recently used
            (``--maxmemory-policy allkeys-lru``).
        port: the TCP port; None picks a free one.
        host: the address to bind (loopback unless the units are on other machines).
    Returns:
        the running server (stop it, or use it as a context manager).
    Raises:
        KVStoreServerError: no server binary, ``maxmemory_bytes`` below 1, or the server did not
            answer within `START_TIMEOUT_S` (its log tail in the message).
    """
    if maxmemory_bytes < 1:
        raise KVStoreServerError(f"maxmemory_bytes must be >= 1 (0 would let the store grow without bound), "
                                 f"got {maxmemory_bytes}")
    binary = server_binary()
    for attempt in range(MAX_PORT_TRIES):
        server = _start_once(binary, maxmemory_bytes, port if port is not None else _free_port(host), host)
        if isinstance(server, KVStoreServer):
            return server
        if port is not None or attempt == MAX_PORT_TRIES - 1:
            raise KVStoreServerError(server)
    raise AssertionError("unreachable")


def _start_once(binary: str, maxmemory_bytes: int, port: int, host: str) -> KVStoreServer | str:
    """The running server, or why it did not come up."""
    work_dir = tempfile.mkdtemp(prefix="disaggsdk-kv-store-")
    log_path = Path(work_dir) / "server.log"
    argv = [binary, "--port", str(port), "--bind", host, "--save", "", "--appendonly", "no",
            "--maxmemory", str(maxmemory_bytes), "--maxmemory-policy", "allkeys-lru",
            "--dir", work_dir, "--logfile", str(log_path), "--daemonize", "no"]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                               start_new_session=True)  # the terminal's Ctrl-C goes to its owner, which stops it
    server = KVStoreServer(process, host, port, maxmemory_bytes, work_dir)
    deadline = time.monotonic() + START_TIMEOUT_S
    why = f"did not answer PING within {START_TIMEOUT_S:.0f} s"
    while time.monotonic() < deadline:
        pid = _server_pid(host, port)
        if pid == process.pid:
            return server
        if pid is not None:
            why = f"found the port taken by another server (pid {pid}); pick another port, or None for a free one"
            break
        if not server.alive():
            why = f"exited with code {process.returncode}"
            break
        time.sleep(0.02)
    server.end_process()  # the log is read after: the process has written all it will
    try:
        log = log_path.read_text(errors="replace")[-2000:] or "(empty)"
    except OSError:
        log = "(none)"
    server.stop()
    return f"{Path(binary).name} on {host}:{port} {why}; its log:\n{log}"
