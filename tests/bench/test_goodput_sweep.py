"""Goodput sweeps: which rates run, with which prompts, and the goodput rate read from them."""

from __future__ import annotations

import math

import pytest

from disaggsdk.bench.goodput_sweep import (
    RateSweep,
    SweepError,
    goodput_line,
    goodput_of,
    parse_request_rates,
    run_sweep,
)

SLOS = {"ttft": 500.0, "tpot": 50.0}


class FakeServer:
    """Meets the SLOs for every request up to ``capacity`` requests/s, for fewer above it; records
    each run's rate and prompt seed."""

    def __init__(self, capacity: float, flat_out: float = 10.0):
        self.capacity, self.flat_out = capacity, flat_out
        self.runs: list[tuple[float, int]] = []

    def __call__(self, rate: float, seed: int) -> dict:
        self.runs.append((rate, seed))
        offered = min(rate, self.flat_out)  # at rate inf it serves flat out
        attainment = 1.0 if offered <= self.capacity else max(0.0, 1.0 - (offered - self.capacity) / self.capacity)
        done = min(rate, self.flat_out)
        return {"slo_attainment": attainment, "request_throughput": done, "request_goodput": done * attainment,
                "completed": 20, "failed": 0, "median_ttft_ms": 100.0, "p99_ttft_ms": 400.0}


def test_request_rates_parse_one_a_list_or_search_and_refuse_the_rest():
    assert parse_request_rates("2") == (2.0,)
    assert parse_request_rates("inf") == (math.inf,)
    assert parse_request_rates("0.5, 1,2") == (0.5, 1.0, 2.0)
    assert parse_request_rates("search") is None
    for bad in ("fast", "0", "1,-2", ""):
        with pytest.raises(SweepError, match="--request-rate"):
            parse_request_rates(bad)


def test_a_list_stops_at_the_first_rate_that_misses_the_target_and_noise_above_cannot_raise_it():
    assert goodput_of({0.5: 1.0, 1.0: 0.95, 2.0: 0.7, 4.0: 0.92}, 0.9) == 1.0
    assert goodput_of({0.5: 0.8, 1.0: 1.0}, 0.9) == 0.0  # the lowest rate already misses it
    assert goodput_of({1.0: 0.9, 2.0: 0.9}, 0.9) == 2.0  # the target itself is met


def test_a_sweep_of_a_list_runs_each_rate_on_new_prompts_in_every_round():
    server = FakeServer(capacity=1.5)
    doc = run_sweep(server, RateSweep((0.5, 1.0, 2.0), rounds=2), SLOS, seed=7)
    assert [rate for rate, _ in server.runs] == [0.5, 1.0, 2.0] * 2
    seeds = [seed for _, seed in server.runs]
    assert len(set(seeds)) == 6 and 7 not in seeds  # the base seed is the warm-up's alone
    assert doc["goodput_request_rate"] == 1.0 and doc["goodput_rounds"] == [1.0, 1.0]
    assert doc["goodput_range"] == [1.0, 1.0] and doc["goodput_range_confidence"] == 0.5
    assert [row["slo_attainment"] for row in doc["sweep"][:3]] == [1.0, 1.0, pytest.approx(2 / 3)]
    assert doc["slos_ms"] == SLOS and doc["slo_attainment_target"] == 0.9 and doc["rates"] == [0.5, 1.0, 2.0]


def test_a_search_measures_the_flat_out_rate_then_bisects_under_it():
    server = FakeServer(capacity=3.0, flat_out=8.0)
    doc = run_sweep(server, RateSweep(search_steps=5), SLOS)
    rates = [rate for rate, _ in server.runs]
    assert math.isinf(rates[0]) and rates[1:] == [4.0, 2.0, 3.0, 3.5, 3.25]
    # 3.25 req/s: 92% met the SLOs, the highest probed rate that met the target
    assert doc["goodput_request_rate"] == 3.25
    assert doc["sweep"][0]["request_rate"] == "inf" and doc["goodput_range_confidence"] is None
    assert "search" in doc["rates"]


def test_a_server_that_meets_the_slos_flat_out_has_its_throughput_as_goodput():
    server = FakeServer(capacity=100.0, flat_out=8.0)
    doc = run_sweep(server, RateSweep(), SLOS)
    assert len(server.runs) == 1 and doc["goodput_request_rate"] == 8.0


def test_rounds_report_their_median_and_the_confidence_of_their_range():
    capacities = iter([1.0, 3.0, 2.0])
    state = {"server": FakeServer(next(capacities))}

    def run_at(rate, seed):
        if rate == 0.5 and state["server"].runs:  # a new round: the machine is another minute's
            state["server"] = FakeServer(next(capacities))
        return state["server"](rate, seed)

    doc = run_sweep(run_at, RateSweep((0.5, 1.0, 2.0, 3.0), rounds=3), SLOS)
    assert doc["goodput_rounds"] == [1.0, 3.0, 2.0] and doc["goodput_request_rate"] == 2.0
    assert doc["goodput_range"] == [1.0, 3.0] and doc["goodput_range_confidence"] == 0.75
    line = goodput_line("tiny_pd", doc)
    assert "goodput 2.00 req/s" in line and "75% confidence" in line and "90% of requests" in line


def test_a_sweep_without_slos_or_with_bad_settings_is_refused():
    with pytest.raises(SweepError, match="--goodput"):
        run_sweep(FakeServer(1.0), RateSweep((1.0, 2.0)), {})
    for bad in ({"target": 0.0}, {"target": 1.5}, {"search_steps": 0}, {"rounds": 0}, {"rates": (2.0, 1.0)},
                {"rates": (1.0, 1.0)}, {"rates": (1.0, math.inf)}):
        with pytest.raises(SweepError):
            RateSweep(**bad)


def test_a_sweep_names_the_slo_that_gave_out_first_and_the_ttft_phase_behind_it():
    def server(rate: float, seed: int) -> dict:
        over = rate > 2.0
        return {"slo_attainment": 0.5 if over else 1.0, "request_throughput": min(rate, 3.0),
                "request_goodput": 1.0, "completed": 10, "failed": 0,
                "slo_missed_ttft": 0.4 if over else 0.0, "slo_missed_tpot": 0.1 if over else 0.0,
                "ttft_phases": {"requests": 10, "unmeasured": 0,
                                "mean_ms": {"prefill_queue": 300.0, "prefill_compute": 80.0, "server_ttft": 400.0},
                                "median_ms": {}}}

    doc = run_sweep(server, RateSweep((1.0, 2.0, 4.0, 8.0)), SLOS)
    assert doc["sweep"][0]["slo_missed"] == {"ttft": 0.0, "tpot": 0.0}
    assert doc["sweep"][0]["slowest_ttft_phase"] == "prefill_queue"  # the server's whole TTFT is not a phase
    assert doc["limited_by"] == {"request_rate": 4.0, "slo": "ttft", "missed_share": 0.4, "ttft_phase": "prefill_queue"}
    assert "limited by TTFT (its longest phase: prefill_queue): 40% of requests missed it at 4.00 req/s" \
        in goodput_line("tiny", doc)
    met = run_sweep(server, RateSweep((1.0, 2.0)), SLOS)
    assert met["limited_by"] is None and "limited by" not in goodput_line("tiny", met)
