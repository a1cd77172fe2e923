"""The shared-KV-pool hand-over: tp workers send their pools (memfd or cuMem) to the instance head.

One transfer engine on the head process registers every rank's pool (docs/architecture.md, "Shared
KV memory"). A worker connects to the head's Unix socket, sends its tp rank (4 bytes) and then
the fd (SCM_RIGHTS, `rank_pool.send_rank_pool`), and waits for a one-byte ack (`send_pool`). The
head's `PoolCollector` is started before the engine spawns its workers; `wait` returns every rank's
pool mapped here (`RankPool`: a memfd region, or a CUDA allocation imported and mapped).
`die_with_parent` keeps every rank from outliving its launcher.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
import threading
import time

from disaggsdk.errors import DisaggError
from disaggsdk.kv.pools.base import RankPool, SharedMemoryError
from disaggsdk.kv.pools.rank_pool import recv_rank_pool, send_rank_pool

RANK_HEADER = struct.Struct("<I")
_PR_SET_PDEATHSIG = 1


class SharedKVError(DisaggError):
    """A worker could not hand its KV pool to the instance head."""


def send_pool(path: str, rank: int, region: RankPool, timeout_s: float = 60.0) -> None:
    """Hand ``region`` (tp rank ``rank``'s pool) to the head listening at ``path``; wait for its ack.

    Raises:
        SharedKVError: the head is not listening or went away.
    """
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(RANK_HEADER.pack(rank))
            send_rank_pool(sock, region)
            sock.recv(1)  # the head's ack: it has mapped the region
    except (OSError, SharedMemoryError) as exc:
        raise SharedKVError(f"tp rank {rank}: cannot hand the KV pool to the head at {path}: {exc}") from exc


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Ask Linux to send this process ``signum`` when its parent dies, so no rank outlives its launcher.

    Linux sends it when the parent *thread* that started this process exits. A process that must
    clean up first (a unit removing its /dev/shm files) asks for SIGTERM and handles it.

    Args:
        signum: the signal; SIGKILL (the default) needs no handler.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the launcher's close() still stops every process


class PoolCollector:
    """Listens at ``path`` for ``num_workers`` pools (tp ranks 1 .. num_workers).

    Args:
        path: a Unix socket path (in a private directory).
        num_workers: tp - 1.
    """

    def __init__(self, path: str, num_workers: int):
        self.path = path
        self.regions: dict[int, RankPool] = {}
        self.error: str | None = None
        self._num_workers = num_workers
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(max(1, num_workers))
        self._sock.settimeout(0.5)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="kv-pool-collector", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while len(self.regions) < self._num_workers and not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                self.error = str(exc)
                return
            with conn:
                try:
                    conn.settimeout(30)
                    (rank,) = RANK_HEADER.unpack(conn.recv(RANK_HEADER.size, socket.MSG_WAITALL))
                    self.regions[rank] = recv_rank_pool(conn)
                    conn.sendall(b"k")
                except Exception as exc:  # noqa: BLE001 - any failure is reported by wait(); the worker fails on its side too
                    self.error = f"{type(exc).__name__}: {exc}"

    def wait(self, timeout_s: float) -> dict[int, RankPool]:
        """Every worker's pool by tp rank, mapped here.

        Raises:
            SharedKVError: not all arrived within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while len(self.regions) < self._num_workers and time.monotonic() < deadline and self.error is None:
            time.sleep(0.01)
        if len(self.regions) < self._num_workers:
            raise SharedKVError(f"got the KV pools of tp ranks {sorted(self.regions)} of 1..{self._num_workers}: "
                                f"{self.error or 'timed out'}")
        return dict(self.regions)

    def close(self) -> None:
        """Stop listening and remove the socket file (the regions stay with the caller)."""
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
