"""One request's phases as one unit recorded them: the spans a unit ships to the router, which turns
them into OpenTelemetry spans (`serve.tracing.request_tracing`).

Pure bookkeeping: no clocks are read here. Times are ``time.time_ns()`` of the unit (epoch
nanoseconds: comparable across the units' machines, as far as their clocks agree), never
``time.monotonic()``, whose zero differs from process to process.
"""

from __future__ import annotations

import msgspec

AttributeValue = str | int | float


class SpanRecord(msgspec.Struct, frozen=True, array_like=True):
    """One phase of one request on one unit.

    ``parent`` is the index of the enclosing span in the same `RequestSpanRecords.spans` list
    (always a smaller index); -1: directly under the unit's span for the request.
    """

    name: str
    start_ns: int
    end_ns: int
    parent: int = -1
    attributes: dict[str, AttributeValue] = {}


class RequestSpanRecords(msgspec.Struct, frozen=True):
    """Every span one unit recorded for one request, from its arrival (``start_ns``) at the unit
    to the unit letting go of it (``end_ns``)."""

    request_id: str
    start_ns: int
    end_ns: int
    spans: list[SpanRecord] = []


def epoch_ns(monotonic_s: float, offset_ns: int) -> int:
    """A ``time.monotonic()`` reading as epoch nanoseconds, given ``offset_ns`` = ``time.time_ns() -
    time.monotonic_ns()`` taken by the caller (one process, one offset: readings keep their order)."""
    return int(monotonic_s * 1e9) + offset_ns
