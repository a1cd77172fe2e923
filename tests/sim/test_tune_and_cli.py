"""`disaggsdk simulate` and `disaggsdk tune`: SLO parsing, ranking, spec output, CLI errors."""

import json

import attrs
import pytest

from disaggsdk.errors import SpecError
from disaggsdk.models import resolve_model
from disaggsdk.plan.memory import spec_memory_problems
from disaggsdk.sim.hardware import load_profile
from disaggsdk.sim.simulator import SimConfig
from disaggsdk.sim.tune import candidate_units, highest_count, max_rate, parse_slos, tune
from disaggsdk.sim.workload import Workload
from disaggsdk.spec import EngineSettings, Hardware, Role, Spec, load_spec


def test_parse_slos_maps_to_bench_field_names():
    assert parse_slos("ttft_p90_ms=500, itl_p99_ms=50,tpot_mean_ms=20") == {
        "p90_ttft_ms": 500.0, "p99_itl_ms": 50.0, "mean_tpot_ms": 20.0}
    with pytest.raises(SpecError, match="METRIC_STAT_ms"):
        parse_slos("latency=5")
    with pytest.raises(SpecError, match="positive number"):
        parse_slos("ttft_p90_ms=abc")


def test_candidates_include_dp_decode_only_for_mla():
    r1 = [c.label for c in candidate_units(Spec(model="deepseek-r1"), resolve_model("deepseek-r1"))]
    # Qwen's FP8 release: the bf16 one at tp 8 leaves too little KV for one 262k-token request at 0.9 of an H200
    qwen = [c.label for c in candidate_units(Spec(model="qwen3-coder-fp8"), resolve_model("qwen3-coder-fp8"))]
    assert "1P(tp8):3D(tp8)" in r1 and any("dp8" in x for x in r1)
    assert not any("dp8" in x for x in qwen) and "colocated 2xtp8" in qwen


def test_no_layout_tune_proposes_overflows_memory():
    r1 = resolve_model("deepseek-r1")
    bf16 = EngineSettings(dtype="bfloat16")
    h200 = Spec(model="deepseek-r1", engine=bf16)
    units = candidate_units(h200, r1)
    # data-parallel decode shards the experts (ep 8): a whole R1 per dp rank fits no GPU
    assert "1P(tp8):3D(tp1xdp8)" in [c.label for c in units]
    assert all(c.decode.ep == c.decode.tp * c.decode.dp for c in units if c.decode.dp > 1)
    # R1's FP8 weights are ~86 GB per rank at tp 8 and ~101 GB per dp rank with ep 8: nothing fits 72 GB of an H100
    assert candidate_units(Spec(model="deepseek-r1", engine=bf16, hardware=Hardware(gpu="h100")), r1) == []
    config = SimConfig(load_profile("h200"), weight_dtype="fp8")
    rows = tune(h200, r1, config, {"p99_itl_ms": 200.0}, Workload(1.0, 5.0, 512, 16, 0.5), gpus=32, target_qps=1.0,
                candidates=[c for c in units if c.label in ("1P(tp8):1D(tp8)", "1P(tp8):1D(tp1xdp8)")])
    assert len(rows) == 2
    for row in rows:
        assert spec_memory_problems(row["spec"], r1) == [], row["label"]


def test_the_sim_takes_the_weight_dtype_from_the_checkpoint_and_capacity_from_the_plan():
    from disaggsdk.plan import make_plan
    from disaggsdk.sim.simulator import Simulation, default_weight_dtype

    assert [default_weight_dtype(m) for m in ("deepseek-r1", "qwen3-coder", "qwen3-coder-fp8", "deepseek-r1-tiny")] \
        == ["fp8", "bfloat16", "fp8", "bfloat16"]
    spec = load_spec("specs/r1_dp.yaml")
    sim = Simulation(spec, SimConfig(load_profile("h200"), weight_dtype="fp8"))
    plan = make_plan(spec)
    assert [i.kv_capacity_tokens for i in sim.prefill + sim.decode] == [m.kv_tokens for m in plan.memory]
    with pytest.raises(SpecError, match=r"decode.ep: 8"):
        Simulation(attrs.evolve(spec, decode=attrs.evolve(spec.decode, ep=1)), SimConfig(load_profile("h200")))


def test_a_stricter_slo_never_admits_more_load():
    spec = Spec(model="deepseek-r1", prefill=Role(tp=8), decode=Role(tp=8, replicas=3))
    config = SimConfig(load_profile("h200"), weight_dtype="fp8")
    work = Workload(1.0, 20.0, 2048, 64, 0.5)
    loose = max_rate(spec, config, False, {"p99_itl_ms": 40.0}, work)
    strict = max_rate(spec, config, False, {"p99_itl_ms": 12.0}, work)
    assert 0 < strict <= loose


def test_simulate_cli_json_and_table(run_cli):
    out = run_cli("simulate", "specs/r1_tp.yaml", "--qps", "1,2", "--duration-s", "20", "--compare", "--json")
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    assert [(r["qps"], r["mode"]) for r in runs] == [(1.0, "disaggregated"), (1.0, "colocated"),
                                                     (2.0, "disaggregated"), (2.0, "colocated")]
    assert all("p99_itl_ms" in r and "mean_ttft_ms" in r for r in runs)
    assert "all_to_all" not in json.loads(out.stdout)["config"]  # tp 8, experts tp-sliced: no exchange
    table = run_cli("simulate", "specs/r1_dp.yaml", "--qps", "1", "--duration-s", "10")
    assert table.returncode == 0 and "disagg" in table.stdout
    # the dp figures say what their expert all-to-all assumes
    assert "expert all-to-all (prefill ep 8, decode ep 8): uniform routing" in table.stdout and "8 us per call" in table.stdout


def test_simulate_cli_errors_exit_2(run_cli):
    bad = run_cli("simulate", "specs/r1_tp.yaml", "--qps", "fast")
    assert bad.returncode == 2 and "--qps" in bad.stderr and "Traceback" not in bad.stderr
    missing = run_cli("simulate", "specs/tiny_local.yaml", "--profile", "nope")
    assert missing.returncode == 2 and "unknown hardware profile 'nope'" in missing.stderr
    no_runs = run_cli("simulate", "specs/tiny_local.yaml", "--profile", "h200", "--validate", "--repeat", "0")
    assert no_runs.returncode == 2 and "--repeat" in no_runs.stderr and "Traceback" not in no_runs.stderr


def test_tune_cli_writes_a_loadable_spec(run_cli, tmp_path):
    out = tmp_path / "best.yaml"
    args = ["tune", "qwen3-coder", "--gpus", "32", "--slo", "ttft_p90_ms=2000,itl_p99_ms=60", "--qps", "2",
            "--input-len", "1024", "--output-len", "64", "--duration-s", "10", "--out", str(out), "--json"]
    # bf16 Qwen3-Coder at tp 8 leaves 113k tokens of KV at 0.9 of an H200: not one 262k-token request
    refused = run_cli(*args)
    assert refused.returncode == 2 and "fits its memory" in refused.stderr and "262,144 tokens" in refused.stderr
    assert "--max-model-len" in refused.stderr
    capped = run_cli(*args, "--max-model-len", "65536")
    assert capped.returncode == 0, capped.stderr
    assert load_spec(out).engine.max_model_len == 65536
    result = run_cli(*args, "--memory-utilization", "0.95")
    assert result.returncode == 0, result.stderr
    ranking = json.loads(result.stdout)["ranking"]
    assert ranking[0]["fits"] and ranking[0]["goodput_per_gpu"] >= max(r["goodput_per_gpu"] for r in ranking if r["fits"])
    spec = load_spec(out)
    assert spec.model == "qwen3-coder" and spec.name == "qwen3-coder-tuned" and spec.engine.memory_utilization == 0.95


def test_simulate_takes_the_mtp_acceptance_a_benchmark_measured(run_cli, tmp_path):
    spec = tmp_path / "mtp.yaml"
    spec.write_text(open("specs/tiny_pd.yaml").read().replace("model: qwen3-coder-tiny", "model: deepseek-r1-tiny")
                    + "speculative:\n  method: mtp\n")
    args = ["simulate", str(spec), "--profile", "h200", "--qps", "2", "--duration-s", "10", "--json"]
    unmeasured = run_cli(*args)  # a spec that drafts with mtp: no assumed acceptance
    assert unmeasured.returncode == 2 and "give --mtp-acceptance, measured" in unmeasured.stderr
    bench = tmp_path / "bench.json"  # what `disaggsdk bench SPEC --output` writes for such a spec
    bench.write_text(json.dumps({"completed": 16, "speculative": {"num_drafts": 100, "num_draft_tokens": 100,
                                                                  "num_accepted_tokens": 74,
                                                                  "per_position_acceptance": [0.74]}}))
    measured = run_cli(*args, "--mtp-acceptance", str(bench))
    assert measured.returncode == 0, measured.stderr
    doc = json.loads(measured.stdout)
    assert doc["config"]["mtp_acceptance"] == {"value": 0.74, "source": "measured (bench.json)"}
    off = run_cli(*args, "--mtp-acceptance", "0")
    faster = doc["runs"][0]["mean_tokens_per_s_per_request"] > json.loads(off.stdout)["runs"][0][
        "mean_tokens_per_s_per_request"]
    assert faster  # the measured acceptance is what the simulated decode runs at
    (tmp_path / "plain.json").write_text(json.dumps({"completed": 16}))
    no_figures = run_cli(*args, "--mtp-acceptance", str(tmp_path / "plain.json"))
    assert no_figures.returncode == 2 and "no acceptance figures" in no_figures.stderr
    assert run_cli(*args, "--mtp-acceptance", "1.5").returncode == 2


def test_tune_never_builds_a_deployment_past_the_spec_bounds(run_cli):
    # a rate that needs more than the spec's 4,096 GPUs: the row does not fit and keeps one unit's spec (scaling it
    # was a replica count past the bound, a traceback)
    r1 = resolve_model("deepseek-r1")
    spec = Spec(model="deepseek-r1", engine=EngineSettings(dtype="bfloat16"))
    units = [c for c in candidate_units(spec, r1) if c.label == "1P(tp8):1D(tp8)"]
    (row,) = tune(spec, r1, SimConfig(load_profile("h200"), weight_dtype="fp8"), {"p99_itl_ms": 200.0},
                  Workload(1.0, 5.0, 512, 16, 0.5), gpus=4096, target_qps=1e5, candidates=units)
    assert row["gpus_needed"] > 4096 and not row["fits"] and row["spec"].decode.replicas == 1
    # the flags that set spec keys are checked as the keys are, one line naming the flag
    for flags, message in ((["--gpus", "100000"], "--gpus 100,000: a deployment has at most 4,096 GPUs"),
                           (["--gpus-per-node", "0"], "--gpus-per-node (gpus_per_node): must be a positive number"),
                           (["--memory-utilization", "7"], "--memory-utilization (memory_utilization): must be a "
                                                           "fraction in (0, 1]")):
        result = run_cli("tune", "deepseek-r1", "--gpus", "8", "--slo", "itl_p99_ms=60", "--request-rate", "1", *flags)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.count("error:") == 1 and message in result.stderr, result.stderr


def test_highest_count_finds_the_last_count_that_holds():
    for limit in (1, 2, 3, 7, 8, 9, 63, 100):
        tried: list[int] = []

        def ok(n: int, limit: int = limit, tried: list[int] = tried) -> bool:
            tried.append(n)
            return n <= limit
        assert highest_count(ok, 1, 1024) == limit
        assert len(tried) <= 2 * limit.bit_length() + 2  # doubling, then bisection: no count-by-count walk
    assert highest_count(lambda n: n <= 5, 8, 64) == 0  # the start fails
    assert highest_count(lambda n: True, 3, 40) == 40  # capped
    with pytest.raises(ValueError, match="1 <= start <= maximum"):
        highest_count(lambda n: True, 0, 4)
