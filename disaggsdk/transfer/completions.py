"""Completion delivery: one Python thread turns native events into resolved futures."""

from __future__ import annotations

import os
import queue
import threading
from concurrent.futures import Future
from typing import Any

from disaggsdk.transfer.errors import TransferError

EV_BATCH_DONE, EV_IMM_DONE, EV_RECV, EV_SEND_DONE, EV_ERROR = 1, 2, 3, 4, 5
_EVENTS_PER_CALL = 64
_WAIT_MS = 500


class WakeFd:
    """An eventfd the pump writes; a loop selects on it (`fileno`) and `clear`s it when woken."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def fileno(self) -> int:
        return self.fd

    def clear(self) -> None:
        """Reset it (nothing to read is fine)."""
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass


class CompletionPump:
    """Owns the futures of in-flight operations of one engine and the thread resolving them."""

    def __init__(self, ffi: Any, lib: Any, engine: Any, name: str):
        self._ffi, self._lib, self._engine = ffi, lib, engine
        self._lock = threading.Lock()
        self._futures: dict[tuple[int, int], Future] = {}
        self.messages: queue.Queue[bytes] = queue.Queue()
        self.async_errors: list[str] = []  # provider errors not tied to one of our requests
        self.wake = WakeFd()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def track(self, kind: int, op_id: int) -> Future:
        """Returns a new future for the operation (kind, op_id), registered before submission.

        Raises:
            TransferError: an operation with the same id is already in flight.
        """
        fut: Future = Future()
        with self._lock:
            if (kind, op_id) in self._futures:
                raise TransferError(f"operation {op_id} is already in flight (event kind {kind}):"
                                    " use a fresh id, or cancel the old one first")
            self._futures[(kind, op_id)] = fut
        return fut

    def num_tracked(self, kind: int) -> int:
        """Operations of ``kind`` whose event has not come (nor been forgotten)."""
        with self._lock:
            return sum(1 for k, _ in self._futures if k == kind)

    def forget(self, kind: int, op_id: int) -> Future | None:
        """Removes and returns the future of (kind, op_id); later events for it are dropped."""
        with self._lock:
            return self._futures.pop((kind, op_id), None)

    def _resolve(self, kind: int, op_id: int, status: int, what: str) -> None:
        fut = self.forget(kind, op_id)
        if fut is None or fut.done():
            return  # cancelled or duplicate: dropped on purpose (late events are normal)
        if status == 0:
            fut.set_result(None)
        else:
            reason = self._ffi.string(self._lib.fab_strerror(status)).decode(errors="replace")
            fut.set_exception(TransferError(f"{what} {op_id} failed: {reason} ({status})"))

    def _run(self) -> None:
        ffi, lib = self._ffi, self._lib
        events = ffi.new("fab_event[]", _EVENTS_PER_CALL)
        while True:
            n = lib.fab_wait_events(self._engine, events, _EVENTS_PER_CALL, _WAIT_MS)
            if n < 0:
                break  # -FI_ESHUTDOWN: the engine is closing and the queue is empty
            wake = False
            for i in range(n):
                ev = events[i]
                wake = wake or ev.kind in (EV_RECV, EV_IMM_DONE)
                if ev.kind == EV_BATCH_DONE:
                    self._resolve(EV_BATCH_DONE, ev.id, ev.status, "write batch")
                elif ev.kind == EV_IMM_DONE:
                    self._resolve(EV_IMM_DONE, ev.id, ev.status, "immediate counter")
                elif ev.kind == EV_SEND_DONE:
                    self._resolve(EV_SEND_DONE, ev.id, ev.status, "control message")
                elif ev.kind == EV_RECV:
                    self.messages.put(bytes(ffi.buffer(ev.data, ev.len)))
                    lib.fab_free(ev.data)
                elif ev.kind == EV_ERROR:
                    reason = ffi.string(lib.fab_strerror(ev.status)).decode(errors="replace")
                    self.async_errors.append(f"{reason} (provider errno {ev.id})")
            if wake:
                os.eventfd_write(self.wake.fd, 1)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Waits for the thread (after fab_shutdown) and fails every unresolved future."""
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            os.close(self.wake.fd)
        with self._lock:
            pending, self._futures = self._futures, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(TransferError("the transfer engine was closed before this "
                                                "operation completed"))
