"""Goodput: the highest request rate at which a target share of requests meets every SLO."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError
from disaggsdk.records.goodput_records import GoodputSweep, LimitedBy, SweepRow

if TYPE_CHECKING:
    from disaggsdk.bench.serve_bench import BenchResult

DEFAULT_TARGET = 0.9  # DistServe's and the field's share of requests that must meet the SLOs
DEFAULT_SEARCH_STEPS = 5
SEARCH = "search"
SEEDS_PER_ROUND = 1000  # round r's k-th run draws its prompts with seed + 1 + r * 1000 + k

# one run of the load at a rate (requests/s; inf: all at once) with prompts drawn from a seed: its
# result (`serve_bench.bench`'s document, with ``slo_attainment`` and ``request_throughput``)
RunAt = Callable[[float, int], "BenchResult"]


class SweepError(DisaggError):
    """A sweep that cannot run as asked (bad rates, no SLOs, a target outside (0, 1])."""


@dataclass(frozen=True)
class RateSweep:
    """What to sweep.

    Args:
        rates: the rates to run, ascending (requests/s); empty: search.
        target: the share of sent requests that must meet every SLO, in (0, 1].
        search_steps: bisections of a search.
        rounds: how many times the whole sweep runs, each on new prompts.
    """

    rates: tuple[float, ...] = ()
    target: float = DEFAULT_TARGET
    search_steps: int = DEFAULT_SEARCH_STEPS
    rounds: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise SweepError(f"--goodput-target {self.target}: a share of requests in (0, 1], e.g. 0.9")
        if self.search_steps < 1 or self.rounds < 1:
            raise SweepError(f"--search-steps ({self.search_steps}) and --repeat ({self.rounds}) must be >= 1")
        if list(self.rates) != sorted(set(self.rates)) or any(not 0 < r < math.inf for r in self.rates):
            raise SweepError(f"--request-rate {','.join(map(str, self.rates))}: give distinct finite rates > 0, "
                             "ascending, e.g. 0.5,1,2")

    @property
    def is_search(self) -> bool:
        """Whether the rates are searched for rather than given."""
        return not self.rates


def parse_request_rates(text: str) -> tuple[float, ...] | None:
    """``--request-rate``: one rate (``"2"``, ``"inf"``), a list (``"0.5,1,2"``), or ``"search"`` (None).

    Raises:
        SweepError: anything else, or a rate that is not positive.
    """
    if text.strip().lower() == SEARCH:
        return None
    try:
        rates = tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        rates = ()
    if not rates or any(not r > 0 for r in rates):
        raise SweepError(f"--request-rate {text!r}: give a rate > 0 (requests/s; inf: all at once), a list such as "
                         f"0.5,1,2 to sweep, or {SEARCH}")
    return rates


def goodput_of(attainment_by_rate: dict[float, float], target: float) -> float:
    """The highest rate below the first (ascending) whose attainment is under ``target``; 0.0 when
    the lowest rate already misses it."""
    best = 0.0
    for rate in sorted(attainment_by_rate):
        if attainment_by_rate[rate] < target:
            break
        best = rate
    return best


def _row(round_index: int, rate: float, result: BenchResult) -> SweepRow:
    return SweepRow(round=round_index, request_rate="inf" if math.isinf(rate) else rate,
                    slo_attainment=float(result["slo_attainment"]),
                    request_throughput=float(result["request_throughput"]),
                    request_goodput=float(result["request_goodput"]), completed=int(result["completed"]),
                    failed=int(result["failed"]), median_ttft_ms=result.get("median_ttft_ms"),
                    p99_ttft_ms=result.get("p99_ttft_ms"), median_tpot_ms=result.get("median_tpot_ms"),
                    p99_tpot_ms=result.get("p99_tpot_ms"), p99_itl_ms=result.get("p99_itl_ms"),
                    slo_missed={key[len("slo_missed_"):]: float(value) for key, value in result.items()
                                if key.startswith("slo_missed_")},
                    slowest_ttft_phase=slowest_phase(result.get("ttft_phases")))


def slowest_phase(phases: object) -> str | None:
    """The phase with the largest mean in a run's ``ttft_phases`` (`report.ttft_phases.PhaseSummary`),
    the server's whole TTFT and the client's share left out; None where none was measured."""
    if not isinstance(phases, dict) or not phases.get("requests"):
        return None
    means = {k: v for k, v in phases.get("mean_ms", {}).items() if k not in ("server_ttft", "http_and_client")}
    return max(means, key=means.__getitem__) if means else None


def limited_by(rows: list[SweepRow], target: float) -> LimitedBy | None:
    """What limited a sweep (`LimitedBy`), from the lowest-rate run of ``rows`` under ``target``."""
    missed = [r for r in rows if r["slo_attainment"] < target]
    if not missed:
        return None
    first = min(missed, key=lambda r: math.inf if isinstance(r["request_rate"], str) else r["request_rate"])
    if not first["slo_missed"]:
        return None
    slo = max(first["slo_missed"], key=first["slo_missed"].__getitem__)
    return LimitedBy(request_rate=first["request_rate"], slo=slo, missed_share=first["slo_missed"][slo],
                     ttft_phase=first["slowest_ttft_phase"] if slo == "ttft" else None)


def first_run_seed(seed: int, round_index: int) -> int:
    """The prompt seed of a round's first run (a search's flat-out run); the round's k-th run has this + k."""
    return seed + 1 + round_index * SEEDS_PER_ROUND


def sweep_round(run_at: RunAt, sweep: RateSweep, seed: int, round_index: int) -> tuple[float, list[SweepRow]]:
    """One round of ``sweep``: its goodput rate and a row per run (in run order)."""
    seeds = iter(range(first_run_seed(seed, round_index), first_run_seed(seed, round_index + 1)))
    rows: list[SweepRow] = []

    def run(rate: float) -> SweepRow:
        rows.append(_row(round_index, rate, run_at(rate, next(seeds))))
        return rows[-1]

    if not sweep.is_search:
        return goodput_of({rate: run(rate)["slo_attainment"] for rate in sweep.rates}, sweep.target), rows
    flat_out = run(math.inf)
    most_per_s = flat_out["request_throughput"]
    if flat_out["slo_attainment"] >= sweep.target:  # the server meets the SLOs even flat out: its throughput is the goodput
        return most_per_s, rows
    low, high = 0.0, most_per_s
    for _ in range(sweep.search_steps):
        rate = (low + high) / 2
        if run(rate)["slo_attainment"] >= sweep.target:
            low = rate
        else:
            high = rate
    return low, rows


def run_sweep(run_at: RunAt, sweep: RateSweep, slos_ms: dict[str, float], seed: int = 0) -> GoodputSweep:
    """Every round of ``sweep`` through ``run_at``.

    Returns:
        ``goodput_request_rate`` (the rounds' median), ``goodput_rounds``, ``goodput_range`` (lowest,
        highest) with ``goodput_range_confidence``, ``slo_attainment_target``, ``slos_ms``, the way the
        rates were chosen, and ``sweep``: a row per run (round, rate, attainment, throughputs, latencies).
    Raises:
        SweepError: no SLOs to attain.
    """
    if not slos_ms:
        raise SweepError("a goodput sweep needs SLOs: --goodput ttft:MS tpot:MS (or --slo ttft=MS,tpot=MS)")
    rates: list[float] = []
    rows: list[SweepRow] = []
    for r in range(sweep.rounds):
        rate, round_rows = sweep_round(run_at, sweep, seed, r)
        rates.append(rate)
        rows += round_rows
    return GoodputSweep(
        goodput_request_rate=statistics.median(rates), goodput_rounds=rates, goodput_range=[min(rates), max(rates)],
        goodput_range_confidence=1 - 2 ** (1 - len(rates)) if len(rates) > 1 else None,
        slo_attainment_target=sweep.target, slos_ms=dict(slos_ms),
        rates=f"{SEARCH} ({sweep.search_steps} bisections of (0, the throughput at rate inf])" if sweep.is_search
        else list(sweep.rates),
        sweep=rows, limited_by=limited_by(rows, sweep.target))


def goodput_line(name: str, doc: GoodputSweep) -> str:
    """One line for a person: the goodput rate, its range over the rounds, the target and the SLOs."""
    slos = ", ".join(f"{k} {v:g} ms" for k, v in doc["slos_ms"].items())
    rounds = doc["goodput_rounds"]
    spread = ""
    if len(rounds) > 1:
        low, high = doc["goodput_range"]
        spread = (f" (rounds {', '.join(f'{r:.2f}' for r in rounds)}: {low:.2f}-{high:.2f} brackets the median "
                  f"with {doc['goodput_range_confidence']:.0%} confidence)")
    line = (f"{name}: goodput {doc['goodput_request_rate']:.2f} req/s{spread}: the highest rate at which "
            f"{doc['slo_attainment_target']:.0%} of requests met {slos}")
    return line + (f"; {limit_text(doc['limited_by'])}" if doc["limited_by"] else "")


def limit_text(limit: LimitedBy) -> str:
    """`LimitedBy` for a person: which SLO gave out first, at what rate, and the phase behind it."""
    rate = limit["request_rate"]
    at = "flat out" if isinstance(rate, str) else f"at {rate:.2f} req/s"
    phase = f" (its longest phase: {limit['ttft_phase']})" if limit["ttft_phase"] else ""
    return f"limited by {limit['slo'].upper()}{phase}: {limit['missed_share']:.0%} of requests missed it {at}"

