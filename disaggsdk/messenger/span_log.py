"""The spans a unit records for one traced request while it holds it (`records.span_records`).

Only requests the router traces get one (`launch.messages.Generate.traced`,
`protocol.PrefillRequest.traced`): an untraced request costs nothing. Up to three threads write a
prefill job's log (the main thread its chunks, the streamer thread its layers, the transfer engine's
pump thread the end of each layer's writes), so every method takes its lock. Times are
``time.time_ns()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future

from disaggsdk.records.span_records import AttributeValue, RequestSpanRecords, SpanRecord


class SpanLog:
    """One request's spans on one unit, appended in any order, some closed later (`close`).

    Args:
        request_id: the request.
        start_ns: when it reached the unit (`time.time_ns()`).
    """

    def __init__(self, request_id: str, start_ns: int):
        self.request_id, self.start_ns = request_id, start_ns
        self._lock = threading.Lock()
        self._spans: list[SpanRecord] = []

    def add(self, name: str, start_ns: int, end_ns: int, parent: int = -1, **attributes: AttributeValue) -> int:
        """Record a finished span; returns its index (the ``parent`` of spans inside it)."""
        with self._lock:
            self._spans.append(SpanRecord(name, start_ns, end_ns, parent, attributes))
            return len(self._spans) - 1

    def extend(self, spans: Sequence[SpanRecord]) -> None:
        """Append another log's finished spans (their ``parent`` indices shift with them)."""
        with self._lock:
            shift = len(self._spans)
            self._spans += [SpanRecord(s.name, s.start_ns, s.end_ns, s.parent + shift if s.parent >= 0 else -1,
                                       s.attributes) for s in spans]

    def open(self, name: str, start_ns: int, parent: int = -1, **attributes: AttributeValue) -> int:
        """Record a span whose end comes later (`close`); returns its index."""
        return self.add(name, start_ns, 0, parent, **attributes)

    def close(self, index: int, end_ns: int, **attributes: AttributeValue) -> None:
        """End span ``index`` at ``end_ns`` (a second close keeps the first end), adding ``attributes``."""
        with self._lock:
            span = self._spans[index]
            if span.end_ns == 0:
                self._spans[index] = SpanRecord(span.name, span.start_ns, end_ns, span.parent,
                                                {**span.attributes, **attributes})

    def close_when_done(self, index: int, futures: Sequence[Future[None]]) -> None:
        """End span ``index`` when the last of ``futures`` resolves (at once when there are none)."""
        if not futures:
            self.close(index, time.time_ns())
            return
        left = [len(futures)]
        lock = threading.Lock()

        def one_done(_fut: Future[None]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self.close(index, time.time_ns())

        for fut in futures:
            fut.add_done_callback(one_done)

    def finish(self, end_ns: int) -> RequestSpanRecords:
        """The request's records as of ``end_ns``: a span still open ends there (a write completion
        whose callback had not run yet when the job was settled)."""
        with self._lock:
            spans = [s if s.end_ns else SpanRecord(s.name, s.start_ns, max(end_ns, s.start_ns), s.parent, s.attributes)
                     for s in self._spans]
        return RequestSpanRecords(self.request_id, self.start_ns, max(end_ns, self.start_ns), spans)
