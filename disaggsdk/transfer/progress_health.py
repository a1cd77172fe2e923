"""Whether a transfer engine's progress thread still goes round, and if not, where it is stuck.

With shm, a peer killed while holding a spinlock of a queue we use (in shared memory) leaves our
progress thread spinning inside libfabric for good (native/README.md); no call can undo that, so
the owner must replace the process (`launch.health`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from disaggsdk.transfer.descriptors import Peer


class ProgressHealth:
    """Reads of one engine's progress thread (two atomics in the native engine).

    Args:
        lib, engine: the native library and engine handle.
        peer_addresses: the engine's peer handle -> address map (filled by `add_peer`).
        closed: whether the engine is closed (then nothing is read).
    """

    def __init__(self, lib: Any, engine: Any, peer_addresses: dict[int, bytes], closed: Callable[[], bool]):
        self._lib, self._engine, self._peer_addresses, self._closed = lib, engine, peer_addresses, closed

    def round_age_s(self) -> float:
        """Seconds since the progress thread last began a round (0.0 once closed). Normally
        microseconds; seconds mean it is stuck inside the provider."""
        if self._closed():
            return 0.0
        return int(self._lib.fab_progress_round_age_ns(self._engine)) / 1e9

    def posting_to(self) -> Peer | None:
        """The peer the thread is handing a write or message to right now, else None. With a
        thread stuck for seconds, that peer's queue is poisoned: it must be replaced too."""
        if self._closed():
            return None
        handle = int(self._lib.fab_progress_posting_to(self._engine))
        if handle == 0:
            return None
        address = self._peer_addresses.get(handle - 1)
        return Peer(handle - 1, address) if address is not None else None
