"""The discrete-event simulator against hand-computed single-request timelines, and under load."""

import pytest

from disaggsdk.sim.hardware import load_profile
from disaggsdk.sim.simulator import SimConfig, Simulation
from disaggsdk.sim.step_batch import StepBatch
from disaggsdk.sim.workload import SimRequest, Workload, WorkloadError, load_trace
from disaggsdk.spec import load_spec

H200 = load_profile("h200")
R1_TP = load_spec("specs/r1_tp.yaml")


def test_one_request_disaggregated_by_hand():
    sim = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8"))
    n_in, n_out = 2049, 5
    result = sim.run([SimRequest(0, 0.0, n_in, n_out)])
    prefill_cost, decode_cost = sim.prefill[0].cost, sim.decode[0].cost
    prefill_s = prefill_cost.batch_time_s(StepBatch(chunks=((2048, 0),)))
    transfer = sim._transfer["prefill-0", "decode-0"]
    exposed = max(transfer.exposed_s(2048, True), transfer.total_s(2048) - prefill_s)
    first_decode = decode_cost.batch_time_s(StepBatch(1, n_in))
    assert result["mean_ttft_ms"] == pytest.approx((prefill_s + exposed + first_decode) * 1e3)
    later = sum(decode_cost.batch_time_s(StepBatch(1, n_in + k)) for k in range(1, n_out))
    assert result["mean_e2el_ms"] == pytest.approx((prefill_s + exposed + first_decode + later) * 1e3)
    assert result["completed"] == 1 and result["total_output_tokens"] == n_out


def test_one_request_colocated_samples_the_first_token_after_prefill():
    sim = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=True))
    result = sim.run([SimRequest(0, 0.0, 1000, 1)])
    cost = sim.decode[0].cost
    assert len(sim.decode) == 4 and not sim.prefill  # 1 prefill + 3 decode nodes, all mixed
    assert result["mean_ttft_ms"] == pytest.approx(cost.batch_time_s(StepBatch(chunks=((1000, 0),))) * 1e3)


def test_under_load_everything_finishes_and_disaggregation_steadies_itl():
    reqs = Workload(qps=4.0, duration_s=60, input_len=4096, output_len=512, range_ratio=0.5, seed=3).requests()
    pct = (50, 99, 99.9)
    dis = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", percentiles=pct)).run(reqs)
    col = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=True, percentiles=pct)).run(reqs)
    assert dis["completed"] == col["completed"] == len(reqs)
    assert dis["total_output_tokens"] == sum(r.output_len for r in reqs)
    # colocated, a decode step now and then carries a prefill chunk: a long tail of stalls
    assert col["p99.9_itl_ms"] > 5 * dis["p99.9_itl_ms"]
    assert col["std_itl_ms"] > 3 * dis["std_itl_ms"]
    assert set(dis["utilisation"]) == {"prefill-0", "decode-0", "decode-1", "decode-2"}
    assert all(0 <= u <= 1.0 + 1e-9 for u in dis["utilisation"].values())


def test_streaming_exposes_less_transfer_than_the_ablation():
    reqs = [SimRequest(0, 0.0, 8192, 2)]
    on = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", streaming=True)).run(reqs)
    off = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", streaming=False)).run(reqs)
    assert on["mean_ttft_ms"] < off["mean_ttft_ms"]


def test_workload_poisson_rate_and_lengths():
    reqs = Workload(qps=10, duration_s=100, input_len=1000, output_len=100, range_ratio=0.5, seed=1).requests()
    assert 900 < len(reqs) < 1100
    assert all(500 <= r.input_len <= 1500 and 50 <= r.output_len <= 150 for r in reqs)
    assert reqs == Workload(qps=10, duration_s=100, input_len=1000, output_len=100, range_ratio=0.5, seed=1).requests()
    with pytest.raises(WorkloadError, match="qps > 0"):
        Workload(qps=0, duration_s=1).requests()


def test_trace_files(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 1.5, "input_len": 10, "output_len": 3}\n'
                    '{"arrival_s": 0.5, "input_len": 20, "output_len": 4}\n')
    assert [r.arrival_s for r in load_trace(path)] == [0.5, 1.5]
    path.write_text('{"arrival_s": 1.5}\n')
    with pytest.raises(WorkloadError, match=r"t\.jsonl:1:"):
        load_trace(path)


def test_mtp_speculation_speeds_decode_by_about_its_acceptance():
    reqs = [SimRequest(0, 0.0, 1025, 401)]
    plain = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8")).run(reqs)
    mtp = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", mtp_acceptance=0.8)).run(reqs)
    speedup = mtp["mean_tokens_per_s_per_request"] / plain["mean_tokens_per_s_per_request"]
    # 1.8 tokens a step; a step verifying two tokens a sequence costs more: its GEMMs run two rows, its
    # attention reads as two queries' (the tables' rule for speculative decode) and the draft layer runs
    assert 1.5 < speedup < 1.8


def test_instances_sharing_cores_slow_each_other_down():
    """Processor sharing: a step already running slows down when another starts beside it."""
    alone = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=True)).run([SimRequest(0, 0.0, 1000, 1)])
    solo_s = alone["mean_ttft_ms"] / 1e3
    # B arrives halfway through A's prefill: A has half left, both then run at half speed on one core
    two = [SimRequest(0, 0.0, 1000, 1), SimRequest(1, solo_s / 2, 1000, 1)]
    own = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=True)).run(two)
    shared = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=True, shared_cores=1)).run(two)
    assert own["p99_ttft_ms"] == pytest.approx(alone["mean_ttft_ms"])  # two instances, own devices
    # A: half alone, then the other half at half speed (1.5x); B: shares for a while, ends alone (1.5x)
    assert shared["median_ttft_ms"] == pytest.approx(1.5 * alone["mean_ttft_ms"])
    assert shared["p99_ttft_ms"] == pytest.approx(1.5 * alone["mean_ttft_ms"])
    two_cores = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=True, shared_cores=2)).run(two)
    assert two_cores["p99_ttft_ms"] == pytest.approx(alone["mean_ttft_ms"])


def test_messenger_step_overhead_slows_disaggregated_units_only():
    import attrs

    reqs = [SimRequest(i, i * 2.0, 1000, 50) for i in range(3)]  # one at a time: no batching effects
    slow = attrs.evolve(H200, messenger_step_overhead_ms=5.0)
    for colocated in (False, True):
        base = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=colocated)).run(reqs)
        more = Simulation(R1_TP, SimConfig(slow, weight_dtype="fp8", colocated=colocated)).run(reqs)
        expected_ms = 0.0 if colocated else 5.0
        assert more["mean_tpot_ms"] - base["mean_tpot_ms"] == pytest.approx(expected_ms, abs=1e-6)


def test_shared_cores_do_all_the_work_and_no_less():
    """On one shared core with work always waiting, the last request ends after exactly the sum of
    the steps' solo durations: a stale completion event must never end a step early."""
    from disaggsdk.sim.instance import SimInstance

    planned = []
    plan_step = SimInstance.plan_step

    def recording(self, now_s):
        dt, chunks = plan_step(self, now_s)
        planned.append(dt)
        return dt, chunks

    reqs = [SimRequest(i, 0.0, 500 + 100 * i, 20 + 5 * i) for i in range(6)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SimInstance, "plan_step", recording)
        result = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", colocated=True, shared_cores=1)).run(reqs)
    assert result["duration"] == pytest.approx(sum(planned))


def test_the_router_counts_requests_still_prefilling_for_their_decode_instance():
    """Two requests at once go to two decode instances, as the real router sends them."""
    spec = load_spec("specs/tiny_local.yaml")  # one prefill, two decode instances
    two = [SimRequest(0, 0.0, 256, 8), SimRequest(1, 0.0, 256, 8)]
    result = Simulation(spec, SimConfig(load_profile("h100"))).run(two)
    assert result["utilisation"]["decode-0"] > 0 and result["utilisation"]["decode-1"] > 0


def test_front_end_cpu_delays_tokens_and_congests_under_load():
    import attrs

    spec = load_spec("specs/tiny_local.yaml")
    cpu = attrs.evolve(load_profile("h100"), frontend_cpu_ms_per_request=10.0, frontend_cpu_ms_per_token=0.0)
    one = [SimRequest(0, 0.0, 256, 8)]
    base = Simulation(spec, SimConfig(load_profile("h100"), colocated=True, shared_cores=2)).run(one)
    slow = Simulation(spec, SimConfig(cpu, colocated=True, shared_cores=2)).run(one)
    assert slow["mean_ttft_ms"] - base["mean_ttft_ms"] == pytest.approx(10.0)  # read by the server first
    assert slow["mean_tpot_ms"] == pytest.approx(base["mean_tpot_ms"])
    # tokens: a server that needs more CPU per token than a decode step takes falls behind, and
    # the client sees tokens at the server's pace, not the engine's
    step_ms = base["mean_tpot_ms"]
    per_token = attrs.evolve(load_profile("h100"), frontend_cpu_ms_per_token=2 * step_ms)
    behind = Simulation(spec, SimConfig(per_token, colocated=True, shared_cores=4)).run(one)
    assert behind["mean_tpot_ms"] == pytest.approx(2 * step_ms, rel=0.01)
    client = Simulation(spec, SimConfig(per_token, colocated=True, shared_cores=4, client_shares_cores=True)).run(one)
    assert client["mean_tpot_ms"] == pytest.approx(behind["mean_tpot_ms"])  # the client costs nothing here
    no_cores = Simulation(spec, SimConfig(per_token, colocated=True)).run(one)
    assert no_cores["mean_tpot_ms"] == pytest.approx(step_ms)  # a GPU cluster's front end runs elsewhere


def test_idle_units_polling_slow_the_busy_ones():
    import attrs

    spec = load_spec("specs/tiny_local.yaml")
    one = [SimRequest(0, 0.0, 256, 8)]
    base = Simulation(spec, SimConfig(load_profile("h100"), colocated=True, shared_cores=1)).run(one)
    polling = attrs.evolve(load_profile("h100"), idle_unit_cores=0.25)  # two idle units: half a core
    busy = Simulation(spec, SimConfig(polling, colocated=True, shared_cores=1)).run(one)
    assert busy["mean_e2el_ms"] == pytest.approx(1.5 * base["mean_e2el_ms"])


def test_a_decode_rank_holds_the_specs_max_num_seqs():
    """A simulated instance admits the requests its spec lets a launched one hold: engine.max_num_seqs
    per rank (issue 34: the simulator had a second default of 256 where every launched unit runs 64)."""
    import attrs

    one = attrs.evolve(R1_TP, engine=attrs.evolve(R1_TP.engine, max_num_seqs=1))
    config = SimConfig(H200, weight_dtype="fp8")
    assert [i.max_num_seqs for i in Simulation(R1_TP, config).decode] == [R1_TP.engine.max_num_seqs] * 3
    assert [i.max_num_seqs for i in Simulation(one, config).decode] == [1] * 3
    reqs = [SimRequest(i, 0.0, 512, 16) for i in range(6)]  # two per decode instance
    assert Simulation(one, config).run(reqs)["mean_e2el_ms"] > Simulation(R1_TP, config).run(reqs)["mean_e2el_ms"]


def _with_local_prefill(spec, tokens):
    import attrs

    return attrs.evolve(spec, transfer=attrs.evolve(spec.transfer, max_local_prefill_tokens=tokens))


def test_conditional_disaggregation_keeps_short_prompts_on_decode_by_hand():
    """A prompt within `transfer.max_local_prefill_tokens` is computed by its decode instance: no prefill
    step, no transfer; its TTFT is one mixed step, and a long prompt is still handed off."""
    sim = Simulation(_with_local_prefill(R1_TP, 512), SimConfig(H200, weight_dtype="fp8"))
    result = sim.run([SimRequest(0, 0.0, 300, 1)])
    cost = sim.decode[0].cost
    assert result["mean_ttft_ms"] == pytest.approx(cost.batch_time_s(StepBatch(chunks=((300, 0),))) * 1e3)
    assert result["utilisation"]["prefill-0"] == 0.0

    sim = Simulation(_with_local_prefill(R1_TP, 512), SimConfig(H200, weight_dtype="fp8"))
    sim.run([SimRequest(0, 0.0, 300, 4), SimRequest(1, 0.0, 2049, 4)])
    assert sim.prefill[0].busy_s > 0  # the long one went to the prefill instance
    assert all(r.finish_s > 0 for r in sim.decode[0].finished + sim.decode[1].finished
               + sim.decode[2].finished)


def test_slo_attainment_counts_requests_that_met_every_slo():
    reqs = Workload(qps=2.0, duration_s=20, input_len=2048, output_len=64, seed=1).requests()
    loose = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", slos_ms={"ttft": 1e6, "tpot": 1e6})).run(reqs)
    assert loose["slo_attainment"] == 1.0
    assert loose["request_goodput"] == pytest.approx(loose["request_throughput"])
    # a TTFT below one prefill step is met by no request; TPOT alone is still met by all
    tight = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", slos_ms={"ttft": 0.001})).run(reqs)
    assert tight["slo_attainment"] == 0.0 and tight["request_goodput"] == 0.0
    mid = loose["median_ttft_ms"]
    half = Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", slos_ms={"ttft": mid})).run(reqs)
    assert 0.3 < half["slo_attainment"] < 0.8
    assert "slo_attainment" not in Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8")).run(reqs)
    with pytest.raises(Exception, match="unknown SLO"):
        Simulation(R1_TP, SimConfig(H200, weight_dtype="fp8", slos_ms={"latency": 1.0})).run(reqs)
