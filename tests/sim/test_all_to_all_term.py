"""The simulator's expert all-to-all term (disaggsdk.sim.all_to_all) against what the engine's
dispatcher measures: gloo groups of ep 2 and 4 processes run steps the way the engine's scheme does
(every rank dispatches the 1/tp slice of its dp group's tokens through every MoE layer and one MTP
pass) with uniform random routing and with deepseek-r1-tiny's own routers, and each rank's
`AllToAllCounters` for the step are compared with the formula: calls exactly, bytes within what
routing variance allows. Then the term in the cost model and the simulator: it follows the spec's
`ep`, not `dp`, and a run says what it assumes."""

from __future__ import annotations

import json
import math

import attrs
import pytest
import torch
from all_to_all_term_worker import MODEL, NUM_MTP_PASSES, cases, group_tokens, run_rank

from disaggsdk.errors import SpecError
from disaggsdk.models import resolve_model
from disaggsdk.sim.all_to_all import (
    AllToAllTraffic,
    all_to_all_assumptions,
    all_to_all_bytes_per_step,
    all_to_all_time_s,
    check_expert_parallel,
    wire_dtype,
)
from disaggsdk.sim.cost_model import StepCostModel
from disaggsdk.sim.hardware import load_profile
from disaggsdk.sim.render import all_to_all_line
from disaggsdk.sim.runner import run_simulations
from disaggsdk.sim.simulator import SimConfig, Simulation
from disaggsdk.spec import load_spec
from tests.spawned_ranks import free_port, run_ranks

TINY = resolve_model(MODEL)
R1 = resolve_model("deepseek-r1")
H200 = load_profile("h200")
ROW_BYTES = TINY.hidden_size * 4  # the CPU engine sends float32 rows
MOE_LAYERS = TINY.num_layers - TINY.first_k_dense
# A bound of 4 standard deviations on a remote count. Tokens are drawn independently, but a token's k
# slots are not (distinct experts; the router picks groups of experts): each token adds 0..k remote pairs
# with mean k*p, whose variance is at most k^2 * p * (1 - p) (Bhatia-Davis), so n tokens' remote pairs
# vary by at most k * sqrt(n * p * (1 - p)). The seeds are fixed: the bound says why the tolerance is
# not a fudge, and it stays tight: under 5% of a rank's count, 2% of the group's.
SIGMAS = 4


def remote_bound_pairs(num_tokens: float, p: float, top_k: int = TINY.num_experts_per_tok) -> float:
    """SIGMAS standard deviations (at most) of the remote pairs of ``num_tokens`` token-layers."""
    return SIGMAS * top_k * math.sqrt(num_tokens * p * (1 - p))


# measured: one gloo group per ep, every case of the worker as one step


@pytest.fixture(scope="module", params=[2, 4], ids=lambda ep: f"ep{ep}")
def measured(request, tmp_path_factory) -> tuple[int, list[list[dict]]]:
    """(ep, per rank the worker's list of steps, in `cases` order)."""
    ep = request.param
    out_dir = tmp_path_factory.mktemp(f"ep{ep}")
    run_ranks(run_rank, ep, (ep, free_port(), str(out_dir)))
    return ep, [torch.load(out_dir / f"rank{r}.pt") for r in range(ep)]


def steps_of(measured, case: str):
    """(tp, dp, [each rank's step record]) for every shape that ran ``case``."""
    ep, per_rank = measured
    for index, (name, tp, dp) in enumerate(cases(ep)):
        if name == case:
            yield tp, dp, [per_rank[r][index] for r in range(ep)]


def formula(tp: int, dp: int, num_tokens: float, remote_fraction: float | None = None) -> AllToAllTraffic:
    """The term for a step like the worker's: float32 rows, every MoE layer and the MTP passes."""
    return all_to_all_bytes_per_step(TINY, tp, dp, tp * dp, num_tokens, activation_dtype="float32",
                                     mtp_pass_tokens=(num_tokens,) * NUM_MTP_PASSES, remote_fraction=remote_fraction)


def test_calls_per_step_are_the_dispatchers_exactly(measured):
    ep, per_rank = measured
    for index, (case, tp, dp) in enumerate(cases(ep)):
        instance_tokens = sum(group_tokens(case, g) for g in range(dp))
        expected = formula(tp, dp, instance_tokens)
        assert expected.num_all_to_all_calls == 4 * (MOE_LAYERS + NUM_MTP_PASSES)
        for rank in range(ep):  # idle ranks included: the group steps in lock-step
            got = per_rank[rank][index]["counters"]
            assert got["num_all_to_all_calls"] == expected.num_all_to_all_calls, (case, tp, dp, rank)
            assert got["num_dispatches"] == got["num_combines"] == expected.num_moe_layers


def assert_exact_with_the_measured_remote_share(tp: int, dp: int, ranks: list[dict], ep: int) -> None:
    """Given the rank's measured remote pairs, the formula gives its dispatch, local and metadata bytes
    exactly (the combine it sends depends on the other ranks' routing: checked over the group)."""
    for step in ranks:
        got, rows = step["counters"], step["rows_dispatched_per_layer"]
        if rows == 0:  # an idle rank: only the split counts leave it
            idle = formula(tp, dp, 0)
            assert (got["dispatch_payload_bytes"], got["local_bytes"]) == (0, 0)
            assert got["metadata_bytes"] == idle.metadata_bytes == idle.num_moe_layers * (ep - 1) * 8
            continue
        pairs = rows * TINY.num_experts_per_tok * (MOE_LAYERS + NUM_MTP_PASSES)
        assert got["rows_sent"] == pairs
        remote_pairs = got["dispatch_payload_bytes"] / ROW_BYTES
        expected = formula(tp, dp, rows * ep, remote_fraction=remote_pairs / pairs)
        assert got["dispatch_payload_bytes"] == pytest.approx(expected.dispatch_payload_bytes, rel=1e-12)
        assert got["local_bytes"] == pytest.approx(expected.local_bytes, rel=1e-12)
        assert got["metadata_bytes"] == pytest.approx(expected.metadata_bytes, rel=1e-12)
    # every remote pair goes out once in dispatch and comes back once in combine
    assert sum(s["counters"]["dispatch_payload_bytes"] for s in ranks) == \
        sum(s["counters"]["combine_payload_bytes"] for s in ranks)


def test_uniform_routing_moves_the_bytes_of_the_formula(measured):
    ep, _ = measured
    p = (ep - 1) / ep
    shapes_seen = 0
    for tp, dp, ranks in steps_of(measured, "uniform"):
        shapes_seen += 1
        instance_tokens = sum(group_tokens("uniform", g) for g in range(dp))
        expected = formula(tp, dp, instance_tokens)
        token_layers = instance_tokens / ep * (MOE_LAYERS + NUM_MTP_PASSES)  # one rank's
        for rank, step in enumerate(ranks):
            got = step["counters"]
            # each rank: its own dispatch, and the combine it returns for the other ranks' tokens
            dispatch_slack = remote_bound_pairs(token_layers, p) * ROW_BYTES
            combine_slack = remote_bound_pairs((ep - 1) * token_layers, 1 / ep) * ROW_BYTES
            assert abs(got["dispatch_payload_bytes"] - expected.dispatch_payload_bytes) <= dispatch_slack, (tp, dp, rank)
            assert abs(got["combine_payload_bytes"] - expected.combine_payload_bytes) <= combine_slack, (tp, dp, rank)
            assert abs(got["local_bytes"] - expected.local_bytes) <= 2 * dispatch_slack, (tp, dp, rank)
            assert dispatch_slack / expected.dispatch_payload_bytes < 0.05  # the bound is tight
        group = sum(s["counters"]["dispatch_payload_bytes"] + s["counters"]["combine_payload_bytes"] for s in ranks)
        group_slack = 2 * remote_bound_pairs(ep * token_layers, p) * ROW_BYTES
        assert abs(group - ep * expected.payload_bytes) <= group_slack, (tp, dp)
        assert_exact_with_the_measured_remote_share(tp, dp, ranks, ep)
    assert shapes_seen == len([d for d in range(1, ep + 1) if ep % d == 0])  # ep == tp (dp 1) among them


def test_the_models_router_sends_the_expected_remote_share(measured):
    """deepseek-r1-tiny's trained group-limited routers on random hidden states are not uniform over experts,
    but while every rank's tokens come from one distribution the remote share of the group's pairs is
    (ep-1)/ep in expectation whatever the expert loads q_r: rank r keeps q_r of its pairs and holds 1/ep of
    all pairs sent, so the group keeps sum_r q_r / ep = 1/ep. The formula is that expectation; the
    measured share must lie within the token-level bound of it, and with the measured share it is exact."""
    ep, _ = measured
    p = (ep - 1) / ep
    for tp, dp, ranks in steps_of(measured, "router"):
        pairs = sum(s["counters"]["rows_sent"] for s in ranks)
        remote_pairs = sum(s["counters"]["dispatch_payload_bytes"] for s in ranks) / ROW_BYTES
        token_layers = pairs / TINY.num_experts_per_tok
        bound = remote_bound_pairs(token_layers, p) / pairs
        assert abs(remote_pairs / pairs - p) <= bound, (tp, dp, remote_pairs / pairs, bound)
        assert bound < 0.03
        assert_exact_with_the_measured_remote_share(tp, dp, ranks, ep)


def test_an_idle_dp_group_still_makes_every_call_and_the_group_moves_the_formulas_bytes(measured):
    ep, _ = measured
    p = (ep - 1) / ep
    for tp, dp, ranks in steps_of(measured, "uniform_group0_idle"):
        assert [s["rows_dispatched_per_layer"] for s in ranks[:tp]] == [0] * tp  # group 0 had no tokens
        instance_tokens = sum(group_tokens("uniform_group0_idle", g) for g in range(dp))
        expected = formula(tp, dp, instance_tokens)  # the mean rank's, idle ones counted
        dispatched = sum(s["counters"]["dispatch_payload_bytes"] for s in ranks)
        slack = remote_bound_pairs(instance_tokens * (MOE_LAYERS + NUM_MTP_PASSES), p) * ROW_BYTES
        assert abs(dispatched - ep * expected.dispatch_payload_bytes) <= slack, (tp, dp)
        # the idle ranks hold experts: they return the others' rows
        assert all(s["counters"]["combine_payload_bytes"] > 0 for s in ranks[:tp])
        assert_exact_with_the_measured_remote_share(tp, dp, ranks, ep)


# the formula by hand


def test_r1_decode_on_8_dp_ranks_by_hand():
    """specs/r1_dp.yaml's decode (tp 1, dp 8, ep 8) at batch 32: a rank dispatches 4 tokens x 8 experts through
    58 MoE layers, 7/8 of the pairs to other ranks, 7,168 bf16 values a row; combine returns as many."""
    traffic = all_to_all_bytes_per_step(R1, 1, 8, 8, 32)
    pairs = 4 * 8 * 58
    assert traffic.dispatch_payload_bytes == traffic.combine_payload_bytes == pytest.approx(pairs * 7 / 8 * 7168 * 2)
    assert traffic.local_bytes == pytest.approx(2 * pairs / 8 * 7168 * 2)
    assert traffic.metadata_bytes == pytest.approx(58 * 7 * 8 + pairs * 7 / 8 * 8)
    assert (traffic.num_all_to_all_calls, traffic.num_moe_layers) == (4 * 58, 58)
    # 46.6 MB over 450 GB/s x 0.7, and 232 calls of 8 us: the calls dominate a decode step's exchange
    time_s = all_to_all_time_s(traffic, H200)
    assert time_s == pytest.approx(traffic.sent_bytes / 315e9 + 232 * 8e-6)
    assert 1.9e-3 < time_s < 2.1e-3


def test_the_term_follows_ep_not_dp():
    # ep == tp at dp 1 (a prefill instance with `ep: tp`) spreads the experts too: each rank sends 1/tp of the tokens
    prefill = all_to_all_bytes_per_step(R1, 8, 1, 8, 8192)
    decode = all_to_all_bytes_per_step(R1, 1, 8, 8, 8192)
    assert prefill == decode and prefill.payload_bytes > 0
    assert all_to_all_bytes_per_step(R1, 2, 2, 4, 64) == all_to_all_bytes_per_step(R1, 4, 1, 4, 64)
    # experts held tp-sliced (ep 1): no exchange, whatever dp is
    none = all_to_all_bytes_per_step(resolve_model("qwen3-coder-tiny"), 1, 4, 1, 64)
    assert (none.sent_bytes, none.local_bytes, none.num_all_to_all_calls) == (0, 0, 0)
    # the wire dtype scales the rows, not the metadata; the MTP layer is one more MoE layer
    f32 = all_to_all_bytes_per_step(R1, 1, 8, 8, 32, activation_dtype="float32")
    assert f32.payload_bytes == pytest.approx(2 * all_to_all_bytes_per_step(R1, 1, 8, 8, 32).payload_bytes)
    with_mtp = all_to_all_bytes_per_step(R1, 1, 8, 8, 32, mtp_pass_tokens=(32,))
    assert (with_mtp.num_moe_layers, with_mtp.num_all_to_all_calls) == (59, 4 * 59)
    assert wire_dtype("fp8") == "bfloat16" and wire_dtype("float32") == "float32"


def test_bad_shapes_are_refused_with_the_fix():
    with pytest.raises(SpecError, match=r"ep=4 must be 1 or the instance's tp\*dp = 1\*8 = 8"):
        check_expert_parallel(R1, 1, 8, 4)
    with pytest.raises(SpecError, match="no routed experts"):
        all_to_all_bytes_per_step(resolve_model("qwen3-tiny"), 1, 2, 2, 8)
    with pytest.raises(SpecError, match="no MTP layer"):
        all_to_all_bytes_per_step(resolve_model("qwen3-coder-tiny"), 1, 2, 2, 8, mtp_pass_tokens=(8,))
    with pytest.raises(SpecError, match=r"remote_fraction must lie in \[0, 1\]"):
        all_to_all_bytes_per_step(R1, 1, 8, 8, 8, remote_fraction=1.5)
    with pytest.raises(SpecError, match="ep=2 must be 1"):
        StepCostModel(R1, H200, tp=1, dp=8, ep=2)


# the term in the cost model and the simulator


def test_the_step_time_charges_the_term_whenever_experts_are_spread():
    for tp, dp in ((8, 1), (1, 8), (2, 4)):
        spread = StepCostModel(R1, H200, tp=tp, dp=dp, ep=tp * dp, weight_dtype="fp8")
        sliced = StepCostModel(R1, H200, tp=tp, dp=dp, ep=1, weight_dtype="fp8")
        step = (32, 32, 32 * 2000, 32 * 2000)
        term = all_to_all_time_s(spread.all_to_all_per_step(32), H200)
        assert spread.all_to_all_per_step(32) == all_to_all_bytes_per_step(R1, tp, dp, tp * dp, 32)  # bf16 rows
        assert spread.step_time_s(*step) - sliced.step_time_s(*step) == pytest.approx(term)
    assert StepCostModel(R1, H200, tp=8, weight_dtype="fp8").all_to_all_per_step(32).num_all_to_all_calls == 0


def test_the_simulator_takes_each_roles_ep_from_the_spec():
    spec = load_spec("specs/r1_dp.yaml")
    config = SimConfig(H200, weight_dtype="fp8")
    sim = Simulation(spec, config)
    assert [(i.cost.tp, i.cost.dp, i.cost.ep) for i in sim.prefill + sim.decode] == [(8, 1, 8), (1, 8, 8)]
    prefill_tp = attrs.evolve(spec, prefill=attrs.evolve(spec.prefill, ep=1))
    assert Simulation(prefill_tp, config).prefill[0].cost.ep == 1
    colocated = Simulation(prefill_tp, attrs.evolve(config, colocated=True))
    assert sorted(i.cost.ep for i in colocated.decode) == [1, 8]


def test_a_run_states_the_assumptions_of_its_all_to_all():
    config = SimConfig(H200, weight_dtype="fp8")
    dp = run_simulations(load_spec("specs/r1_dp.yaml"), config, [False], rates=[1.0], duration_s=5.0)
    term = dp["config"]["all_to_all"]
    assert term == {"ep": {"prefill": 8, "decode": 8}, **all_to_all_assumptions(H200, "bfloat16")}
    assert (term["link_gb_per_s"], term["link_efficiency"], term["latency_us_per_call"]) == (450, 0.7, 8)
    json.dumps(dp["config"])  # the --json output carries it
    line = all_to_all_line(dp)
    assert line is not None
    for words in ("prefill ep 8", "decode ep 8", "uniform routing", "bfloat16 on the wire", "no dedup", "450 GB/s", "x 0.7",
                  "8 us per call", "4 calls per MoE layer"):
        assert words in line
    tp = run_simulations(load_spec("specs/r1_tp.yaml"), config, [False], rates=[1.0], duration_s=5.0)
    assert "all_to_all" not in tp["config"] and all_to_all_line(tp) is None
