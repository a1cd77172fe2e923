"""The head's side of shared KV pools: accept each tp worker's memfd over a Unix socket.

Started before the engine spawns its workers (they connect while the engine waits for them);
`wait` returns every rank's mapped `SharedRegion`. See `disaggsdk.engine.shared_kv`.
"""

from __future__ import annotations

import os
import socket
import threading
import time

from disaggsdk.engine.shared_kv import RANK_HEADER, SharedKVError
from disaggsdk.memory.fd_passing import recv_region
from disaggsdk.memory.shared_memory import SharedRegion


class PoolCollector:
    """Listens at ``path`` for ``num_workers`` pools (tp ranks 1 .. num_workers).

    Args:
        path: a Unix socket path (in a private directory).
        num_workers: tp - 1.
    """

    def __init__(self, path: str, num_workers: int):
        self.path = path
        self.regions: dict[int, SharedRegion] = {}
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
                    self.regions[rank] = recv_region(conn)
                    conn.sendall(b"k")
                except Exception as exc:  # reported by wait(); the worker fails on its side too
                    self.error = f"{type(exc).__name__}: {exc}"

    def wait(self, timeout_s: float) -> dict[int, SharedRegion]:
        """Every worker's region by tp rank.

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
