"""`disaggsdk compare`: a real layout launched and swept on the shipped trace, the target simulated,
and the refusals that come before anything starts."""

from __future__ import annotations

import json

import attrs
import pytest

from disaggsdk.calibrate.engine_profile import save_profile
from disaggsdk.sim.hardware import load_profile


@pytest.fixture
def profile_home(tmp_path):
    """A DISAGGSDK_HOME whose cpu-local profile has the serving stack's fields, so that compare does not
    spend minutes calibrating: its figures are a datasheet's, not this machine's, and no test reads them."""
    profile = attrs.evolve(load_profile("h100"), name="cpu-local", frontend_cpu_ms_per_token=0.1)
    save_profile(profile, tmp_path / "profiles" / "cpu-local.yaml")
    return tmp_path


def test_compare_sweeps_a_layout_here_on_the_shipped_trace_and_simulates_the_target(run_cli, profile_home, tmp_path,
                                                                                     monkeypatch):
    monkeypatch.setenv("DISAGGSDK_HOME", str(profile_home))
    plot = tmp_path / "compare.html"
    p = run_cli("compare", "code-assistant", "specs/qwen3_coder.yaml", "--slo", "ttft=60000,tpot=5000",
                "--layouts", "P1:D1", "--num-prompts", "3", "--search-steps", "1", "--plot", str(plot), "--json",
                timeout_s=400)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    [here] = doc["this_machine"]
    assert here["layout"] == "P1:D1" and here["kind"] == "disaggregated" and here["where"] == "this machine"
    measured = here["measured"]
    # SLOs no request misses: the flat-out run meets them, and its throughput is the goodput
    assert measured["sweep"][0]["request_rate"] == "inf" and measured["sweep"][0]["completed"] == 3
    assert here["goodput_request_rate"] == measured["goodput_request_rate"] == measured["sweep"][0]["request_throughput"]
    assert here["simulated"]["goodput_request_rate"] > 0 and here["simulated_error"] is not None
    from disaggsdk.report.ttft_phases import PHASES

    assert measured["sweep"][0]["slowest_ttft_phase"] in PHASES  # the deployment's TTFT phases came with the run
    assert here["sim_slowdown"] == 1.0 and here["sim_fitted_on"] == []  # alone: no other layout to calibrate on
    [target] = doc["targets"]
    assert target["spec"] == "qwen3-coder" and target["profile"] == "h200"
    assert [lay["layout"] for lay in target["layouts"]][:2] == ["colocated", "P1:D3"]
    assert all(lay["measured"] is None and lay["goodput_request_rate"] > 0 for lay in target["layouts"])
    assert doc["recommendation"].startswith("on this machine (measured): P1:D1")
    assert "recommended" in p.stderr and "P1:D1" in p.stderr and plot.stat().st_size > 1000


@pytest.mark.parametrize("argv, message", [
    (["no-such-trace", "--slo", "ttft=100"], "not a shipped trace"),
    (["code-assistant", "--slo", "ttft=100", "--layouts", "P9:D9"], "no layout P9:D9 here"),
    (["code-assistant", "--slo", "speed=100"], "--slo"),
    (["code-assistant", "--slo", "ttft=100", "--plot", "out.pdf"], "save the plots as .png"),
    (["code-assistant", "--slo", "ttft=100", "specs/absent.yaml"], "absent.yaml"),
])
def test_compare_refuses_what_cannot_work_before_starting_anything(run_cli, profile_home, monkeypatch, argv, message):
    monkeypatch.setenv("DISAGGSDK_HOME", str(profile_home))
    p = run_cli("compare", *argv)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_cluster_compare_checks_its_trace_slos_and_layouts_before_launching(profile_home, monkeypatch):
    from disaggsdk import Cluster
    from disaggsdk.errors import DisaggError

    monkeypatch.setenv("DISAGGSDK_HOME", str(profile_home))
    cpu = Cluster.from_yaml("specs/tiny_pd.yaml")  # a CPU spec is itself what runs here
    with pytest.raises(DisaggError, match="no layout P2:D2 here; the layouts are colocated, P1:D1, conditional"):
        cpu.compare("code-assistant", "ttft=100,tpot=10", only=["P2:D2"])
    with pytest.raises(DisaggError, match="not a shipped trace"):
        Cluster().compare("absent.jsonl", {"ttft": 100.0})
    with pytest.raises(DisaggError, match="--slo"):
        cpu.compare("code-assistant", "fast=1")
