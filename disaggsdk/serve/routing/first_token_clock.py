"""When each request reached the router and when its first token came back: the server's TTFT.

The other end of the TTFT phases (`report.ttft_phases`): the units measure the steps in between.
Times are `time.monotonic()`, the one clock every process of a machine shares.
"""

from __future__ import annotations

from collections import deque

MAX_RECORDS = 4096  # finished first tokens kept for the benchmark


class FirstTokenClock:
    """Per-request router times; not thread-safe (the router calls it under its lock)."""

    def __init__(self, max_records: int = MAX_RECORDS):
        self._received: dict[str, float] = {}
        self._records: deque[tuple[str, float, float]] = deque(maxlen=max_records)

    def received(self, request_id: str, now_s: float) -> None:
        """The router accepted the request (before it went to a unit)."""
        self._received[request_id] = now_s

    def answered(self, request_id: str, now_s: float, has_tokens: bool) -> None:
        """A unit answered the request: with its first tokens (recorded), or its end without any
        (an error or an abort: forgotten). Later answers of the same request are ignored."""
        start = self._received.pop(request_id, None)
        if start is not None and has_tokens:
            self._records.append((request_id, start, now_s))

    def received_at(self, request_id: str) -> float | None:
        """When the router accepted a request still waiting for its first token (None: not waiting)."""
        return self._received.get(request_id)

    def records(self) -> list[tuple[str, float, float]]:
        """``(request_id, received_s, first_token_s)`` of recent requests, oldest first."""
        return list(self._records)
