"""The autoscale policy and its clock, on synthetic served requests and a fake router: which role is
short, the hysteresis (cooldown, a window of the new layout only), the simulator's preview, and what
a decision leaves behind (the log line, /metrics, the list)."""

from __future__ import annotations

import dataclasses

import attrs
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from disaggsdk.report.latency import RequestTimeline
from disaggsdk.serve.autoscale.autoscale_policy import MIN_REQUESTS, Layout, propose, recent_window, window_stats
from disaggsdk.serve.autoscale.autoscale_preview import Preview, preview
from disaggsdk.serve.autoscale.autoscaler import Autoscaler
from disaggsdk.serve.metrics import ServedRequest
from disaggsdk.serve.moves.rebalance import RebalanceReport, RoleChange
from disaggsdk.spec import load_spec

SPEC = load_spec("specs/tiny_pd.yaml")
CONFIG = attrs.evolve(SPEC.serve.autoscale, enabled=True, ttft_ms=500.0, tpot_ms=50.0, window_s=10.0,
                      cooldown_s=5.0)


def stats_of(requests, now_s, config=CONFIG, since_s=0.0, overdue=0):
    return window_stats(recent_window(requests, now_s, config, since_s), config, overdue)


def served(n: int, ttft_ms: float, tpot_ms: float, start_s: float = 100.0, gap_s: float = 0.5,
           prompt: int = 64, output: int = 16) -> list[ServedRequest]:
    out = []
    for i in range(n):
        sent = start_s + i * gap_s
        first = sent + ttft_ms / 1e3
        times = [first + k * tpot_ms / 1e3 for k in range(output)]
        out.append(ServedRequest("decode-0", RequestTimeline(sent, times, prompt), "length", times[-1]))
    return out


def test_slow_first_tokens_ask_for_a_prefill_unit_slow_decode_for_a_decode_unit():
    long_prompts = stats_of(served(12, ttft_ms=900, tpot_ms=20), now_s=110, config=CONFIG)
    assert long_prompts.num_requests == 12 and long_prompts.ttft_attainment == 0 and long_prompts.tpot_attainment == 1
    p = propose(long_prompts, Layout(1, 2), CONFIG)
    assert p is not None and p.after == Layout(2, 1) and "prefill is short" in p.reason
    long_outputs = stats_of(served(12, ttft_ms=100, tpot_ms=80), now_s=112, config=CONFIG)
    p = propose(long_outputs, Layout(2, 1), CONFIG)
    assert p is not None and p.after == Layout(1, 2) and "decode is short" in p.reason
    # the minimums hold; both short or both fine: no change; too few requests: no judgement
    assert propose(long_prompts, Layout(2, 1), CONFIG) is None  # min_decode 1
    assert propose(long_outputs, Layout(0, 3), CONFIG) is None  # min_prefill 0
    both = stats_of(served(12, ttft_ms=900, tpot_ms=80), now_s=112, config=CONFIG)
    assert propose(both, Layout(1, 2), CONFIG) is None
    few = stats_of(served(MIN_REQUESTS - 1, ttft_ms=900, tpot_ms=20), now_s=110, config=CONFIG)
    assert propose(few, Layout(1, 2), CONFIG) is None


def test_requests_queued_past_the_ttft_slo_count_as_misses_before_they_finish():
    few = served(4, ttft_ms=100, tpot_ms=20, start_s=100)
    stats = stats_of(few, now_s=105, config=CONFIG, overdue=6)
    assert stats.num_requests == 10 and stats.ttft_attainment == 0.4 and stats.tpot_attainment == 1.0
    p = propose(stats, Layout(1, 2), CONFIG)
    assert p is not None and p.after == Layout(2, 1)
    only_queued = stats_of([], now_s=105, config=CONFIG, overdue=9)
    assert only_queued.num_requests == 9 and only_queued.ttft_attainment == 0


def test_the_window_keeps_only_recent_requests_of_the_layout_in_place():
    old = served(12, ttft_ms=900, tpot_ms=20, start_s=100)  # before the change at 107
    new = served(3, ttft_ms=100, tpot_ms=20, start_s=107.5)
    stats = stats_of(old + new, now_s=109, config=CONFIG, since_s=107)
    assert stats.num_requests == 3 and stats.ttft_attainment == 1
    assert stats_of(old, now_s=200, config=CONFIG).num_requests == 0  # all ended too long ago
    failed = ServedRequest("", RequestTimeline(105.0, [], 10, error="boom"), "error", 105.1)
    stats = stats_of([failed, *served(3, 100, 20, start_s=104)], now_s=106, config=CONFIG)
    assert stats.ttft_attainment == stats.tpot_attainment == 0.75  # a failed request meets no SLO


@pytest.fixture
def cpu_profile(tmp_path, monkeypatch):
    """A calibrated-looking ``cpu-local`` profile (rates of a 2-core CPU) where the simulator looks for it."""
    from disaggsdk.calibrate.engine_profile import StepSample, fit_profile, save_profile
    from disaggsdk.models import resolve_model

    monkeypatch.setenv("DISAGGSDK_HOME", str(tmp_path))
    profile = attrs.evolve(fit_profile(resolve_model("qwen3-coder-tiny"), [StepSample(1, 1, 10, 10, 0.01)])[0],
                           bf16_tflops=0.08, fp8_tflops=0.08, hbm_gb_per_s=6.0, step_overhead_ms=2.5)
    save_profile(profile, tmp_path / "profiles" / "cpu-local.yaml")


def test_the_simulator_previews_a_prefill_heavy_window(cpu_profile):
    window = served(40, ttft_ms=3000, tpot_ms=20, gap_s=0.2, prompt=1500, output=4)
    p = propose(stats_of(window, 120, attrs.evolve(CONFIG, window_s=60)), Layout(1, 2), CONFIG)
    assert p is not None
    predicted = preview(SPEC, window, p, CONFIG)
    assert 0 <= predicted.before <= 1 and 0 <= predicted.after <= 1
    assert predicted.after >= predicted.before  # a second prefill unit cannot slow long prompts down
    with pytest.raises(ValueError, match="at least one prefill"):
        preview(SPEC, window, dataclasses.replace(p, after=Layout(0, 3)), CONFIG)


class FakeRouter:
    def __init__(self):
        self.spec = attrs.evolve(SPEC, serve=attrs.evolve(SPEC.serve, autoscale=CONFIG))
        self.roles = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
        self.closed = False

    def unit_roles(self):
        return dict(self.roles)

    def num_waiting_past(self, age_s, since_s=0.0):
        return 0


def test_a_decision_is_applied_logged_counted_and_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("DISAGGSDK_HOME", str(tmp_path))  # not calibrated here: no preview, and the note says why
    router = FakeRouter()
    calls = []

    def fake_rebalance(r, prefill, decode):
        calls.append((prefill, decode))
        router.roles["decode-1"] = "prefill"
        return RebalanceReport([RoleChange("decode-1", "decode", "prefill", True)], router.unit_roles())

    monkeypatch.setattr("disaggsdk.serve.autoscale.autoscaler.rebalance", fake_rebalance)
    lines, registry = [], CollectorRegistry()
    window = served(12, ttft_ms=900, tpot_ms=20, start_s=1000)
    scaler = Autoscaler(router, lambda: window, registry, lines.append, "tiny")
    scaler._last_change_s = 990.0
    assert scaler.tick(now_s=993) is None  # within the cooldown
    decision = scaler.tick(now_s=1010)
    assert decision is not None and decision.applied and calls == [(2, 1)]
    assert (decision.before, decision.after) == ("P1:D2", "P2:D1") and scaler.layout() == Layout(2, 1)
    assert lines == [decision.line()] and "prefill is short" in lines[0] and "applied" in lines[0]
    assert decision.predicted is None and "disaggsdk calibrate" in decision.preview_note
    text = generate_latest(registry).decode()
    assert 'disaggsdk_autoscale_decisions_total{applied="true",change="P1:D2->P2:D1",model_name="tiny"} 1.0' in text
    assert 'disaggsdk_autoscale_units{model_name="tiny",role="prefill"} 2.0' in text
    # the same window does not count again: the next judgement needs requests the new layout served
    assert scaler.tick(now_s=1020) is None and scaler.decisions == [decision]


def test_a_change_the_simulator_predicts_a_loss_for_is_not_applied(monkeypatch):
    router = FakeRouter()
    monkeypatch.setattr("disaggsdk.serve.autoscale.autoscaler.rebalance", lambda *a: pytest.fail("must not rebalance"))
    monkeypatch.setattr("disaggsdk.serve.autoscale.autoscaler.preview",
                        lambda *a: Preview(0.9, 0.5))
    scaler = Autoscaler(router, lambda: served(12, ttft_ms=900, tpot_ms=20, start_s=1000), None, lambda _l: None)
    scaler._last_change_s = 990.0
    decision = scaler.tick(now_s=1010)
    assert decision is not None and not decision.applied and "predicts a loss" in decision.outcome
