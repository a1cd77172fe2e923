"""TTFT phases: the router's times joined with both units' records, phase by phase."""

from __future__ import annotations

import pytest

from disaggsdk.records.request_transfer import RequestTransfer
from disaggsdk.report.ttft_phases import PHASES, request_phases, summarize_phases
from disaggsdk.serve.routing.first_token_clock import FirstTokenClock


def records(rid: str, t0: float) -> list[RequestTransfer]:
    """A request received by the router at t0, with each later mark 1, 2, 3... ms after the one before."""
    marks = [t0 + sum(range(1, k + 1)) * 1e-3 for k in range(1, 8)]
    submitted, sent, arrived, f_start, f_end, fired, admitted = marks
    return [
        RequestTransfer(rid, "decode", 9, submitted_s=submitted, sent_s=sent, forward_end_s=f_end, fired_s=fired,
                        admitted_s=admitted),
        RequestTransfer(rid, "prefill", 9, arrived_s=arrived, forward_start_s=f_start, forward_end_s=f_end),
    ]


def test_phases_follow_the_request_and_add_up_to_the_server_ttft():
    d, p = records("a", 100.0)
    first_token = d.admitted_s + 8e-3
    phases = request_phases(100.0, first_token, d, p)
    assert list(phases) == list(PHASES)
    # differences of seconds near 100.0: float64 keeps them to ~1e-11 ms
    assert [v * 1e3 for v in phases.values()] == pytest.approx([1, 2, 3, 4, 5, 6, 7, 8], rel=0, abs=1e-6)
    assert sum(phases.values()) == pytest.approx(first_token - 100.0)


def test_summary_skips_requests_without_both_records():
    recs = records("a", 100.0) + records("b", 200.0)
    local = RequestTransfer("c", "decode", 9, prefilled_locally=True)  # prefilled on the decode unit
    first = [("a", 100.0, 100.028 + 0.008), ("b", 200.0, 200.028 + 0.010), ("c", 300.0, 300.2), ("d", 400.0, 400.1)]
    s = summarize_phases(first, recs + [local])
    assert s["requests"] == 2 and s["unmeasured"] == 2
    assert s["mean_ms"]["prefill_compute"] == pytest.approx(5.0)
    assert s["mean_ms"]["first_step_to_router"] == pytest.approx(9.0)
    assert s["median_ms"]["server_ttft"] == pytest.approx(37.0)
    assert summarize_phases([], recs) == {"requests": 0, "unmeasured": 0, "mean_ms": {}, "median_ms": {}}


def test_first_token_clock_records_the_first_answer_only():
    clock = FirstTokenClock(max_records=2)
    for rid, t in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("e", 4.0)):
        clock.received(rid, t)
    clock.answered("a", 1.5, has_tokens=True)
    clock.answered("a", 1.7, has_tokens=True)  # a later token of the same request
    clock.answered("b", 2.5, has_tokens=False)  # ended without a token (an error): forgotten
    clock.answered("c", 3.25, has_tokens=True)
    clock.answered("e", 4.5, has_tokens=True)
    assert clock.records() == [("c", 3.0, 3.25), ("e", 4.0, 4.5)]  # the oldest ("a") fell off
