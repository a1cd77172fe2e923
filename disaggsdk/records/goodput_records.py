"""The records of goodput sweeps and layout comparisons: what `bench.goodput_sweep` and
`calibrate.layout_compare` return, as JSON-ready TypedDicts, declared once here so that the views
above them (`report.layout_plots`) read them typed. Pure data: nothing is computed here.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class SweepRow(TypedDict):
    """One run of a sweep: its round and rate, and what of its result the sweep keeps (its whole
    document is the run's own). A latency is None where the run asked for no such percentile."""

    round: int
    request_rate: float | str  # "inf": all at once
    slo_attainment: float  # the share of the requests sent that met every SLO
    request_throughput: float
    request_goodput: float
    completed: int
    failed: int
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    median_tpot_ms: float | None
    p99_tpot_ms: float | None
    p99_itl_ms: float | None
    slo_missed: dict[str, float]  # per SLO, the share of the requests sent that missed it
    # the TTFT phase with the largest mean (`report.ttft_phases`), where the server measured them
    slowest_ttft_phase: str | None


class LimitedBy(TypedDict):
    """What kept a sweep's goodput from going higher: in the lowest-rate run that missed the target,
    the SLO missed by the most requests, and (for TTFT, where the server measured its phases) the
    phase of the time to first token that took longest."""

    request_rate: float | str
    slo: str
    missed_share: float
    ttft_phase: str | None


class GoodputSweep(TypedDict):
    """A sweep's result (`run_sweep`); ``target`` and ``cpu`` are added by the command that ran it."""

    goodput_request_rate: float  # the median of the rounds'
    goodput_rounds: list[float]
    goodput_range: list[float]  # lowest, highest
    goodput_range_confidence: float | None  # that the range holds the median; None for one round
    slo_attainment_target: float
    slos_ms: dict[str, float]
    rates: str | list[float]  # the rates given, or how the search chose them
    sweep: list[SweepRow]
    limited_by: LimitedBy | None  # None: no run missed the target (the goodput is the throughput)
    target: NotRequired[str]
    cpu: NotRequired[dict[str, object]]


class LayoutGoodput(TypedDict):
    """One layout's answer: measured here (with the simulator's figure for the same runs beside it), or
    simulated alone at the target's scale."""

    layout: str
    kind: str  # colocated | disaggregated | conditional
    where: str  # "this machine" or the target's hardware
    measured: GoodputSweep | None
    simulated: GoodputSweep
    goodput_request_rate: float  # the measured one where measured, else the simulated one
    simulated_error: float | None  # simulated / measured - 1, where both are > 0
    # measured layouts: the slowdown of the machine's profile the simulator ran at, fitted on the other
    # layouts' flat-out runs (`leave_one_out_slowdowns`), and which layouts those were
    sim_slowdown: float | None
    sim_fitted_on: list[str]


class TargetGoodput(TypedDict):
    """One target spec's layouts, simulated at its own scale, and the layout to choose there."""

    spec: str
    profile: str
    layouts: list[LayoutGoodput]
    recommendation: str


class Comparison(TypedDict):
    """`compare_layouts`'s answer (JSON as it is)."""

    slos_ms: dict[str, float]
    slo_attainment_target: float
    machine_spec: str
    profile: str
    this_machine: list[LayoutGoodput]
    recommendation: str  # on this machine
    targets: list[TargetGoodput]
