"""Where a disaggregated request's time to first token went, phase by phase."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from disaggsdk.records.request_transfer import RequestTransfer

PHASES = ("router_to_decode", "decode_wait", "to_prefill", "prefill_queue", "prefill_compute",
          "exposed_transfer", "counter_to_schedule", "first_step_to_router")


def request_phases(received_s: float, first_token_s: float, decode: RequestTransfer,
                   prefill: RequestTransfer) -> dict[str, float]:
    """The phases of one request, in seconds (keys: `PHASES`); they sum to first_token_s - received_s."""
    marks = [received_s, decode.submitted_s, decode.sent_s, prefill.arrived_s, prefill.forward_start_s,
             prefill.forward_end_s, decode.fired_s, decode.admitted_s, first_token_s]
    return {name: b - a for name, a, b in zip(PHASES, marks, marks[1:])}


class PhaseSummary(TypedDict):
    """`summarize_phases`'s answer (JSON as it is, in a benchmark's result)."""

    requests: int
    unmeasured: int
    mean_ms: dict[str, float]
    median_ms: dict[str, float]


def summarize_phases(first_tokens: Sequence[tuple[str, float, float]],
                     records: Iterable[RequestTransfer]) -> PhaseSummary:
    """Mean and median of each phase over the requests both units measured, in milliseconds.

    Args:
        first_tokens: ``(request_id, received_s, first_token_s)`` from the router.
        records: every unit's recent `RequestTransfer` records.
    Returns:
        ``{"requests": n, "unmeasured": m, "mean_ms": {phase: ms, ..., "server_ttft": ms},
        "median_ms": {...}}``; ``unmeasured`` counts requests with no full pair of records
        (prefilled on the decode unit, retried elsewhere, or colocated).
    """
    decode: dict[str, RequestTransfer] = {}
    prefill: dict[str, RequestTransfer] = {}
    for r in records:
        (decode if r.side == "decode" else prefill)[r.request_id] = r
    rows = []
    for rid, received, first in first_tokens:
        d, p = decode.get(rid), prefill.get(rid)
        if d is None or p is None or d.prefilled_locally or not (d.sent_s and p.arrived_s and d.admitted_s):
            continue
        row = request_phases(received, first, d, p)
        row["server_ttft"] = first - received
        rows.append(row)
    keys = (*PHASES, "server_ttft")
    return {
        "requests": len(rows),
        "unmeasured": len(first_tokens) - len(rows),
        "mean_ms": {k: statistics.fmean(r[k] for r in rows) * 1e3 for k in keys} if rows else {},
        "median_ms": {k: statistics.median(r[k] for r in rows) * 1e3 for k in keys} if rows else {},
    }
