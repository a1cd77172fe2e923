"""Expert parallelism in the engine (issue 36): MoE models whose routed experts are spread over the
ranks of a lock-step dp group (or of one engine's tp ranks) give the greedy tokens of a tp 1
engine, each rank holding only its experts; routing every token to one expert, aborting on one
rank while another decodes, and one rank working alone for 100 steps neither change a token nor
hang the group; settings the engine cannot run are refused with what to set.

Each group runs in spawned processes, one per dp rank (`expert_parallel_engine_worker`), started
and always reaped by `tests.spawned_ranks.run_ranks`; the tp 1 reference runs in this process.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from expert_parallel_engine_worker import (
    Abort,
    Add,
    GroupJob,
    Stop,
    reference_tokens,
    route_every_token_to,
    run_dp_rank,
)

from disaggsdk.engine.config import EngineConfig, EngineError
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.models import resolve_model
from disaggsdk.plan.memory import expert_range
from tests.spawned_ranks import free_port, run_ranks

# (prompt, max_tokens): different lengths and budgets, so the ranks' requests finish at different steps
PROMPTS: tuple[tuple[tuple[int, ...], int], ...] = (
    ((1, 2, 3, 4, 5), 12),
    ((7, 8, 9), 10),
    ((11, 12, 13, 14, 15, 16, 17), 12),
    ((3, 3, 3), 4),  # the short one: its rank finishes first and idles while the others decode
    ((20, 21, 22, 23), 8),
)
# which of PROMPTS each dp rank gets: uneven, and at dp 4 one rank gets none
SPLIT = {2: ((0, 1, 2, 4), (3,)), 4: ((0, 4), (1, 2), (3,), ())}
SHORT_PROMPT = 3


@functools.cache
def reference(model: str, prompts: tuple[tuple[tuple[int, ...], int], ...], mtp: bool,
              route_to_expert: int | None = None) -> tuple[list[list[int]], dict[str, int]]:
    """The tp 1 engine's tokens (cached: several tests compare with the same run)."""
    return reference_tokens(model, prompts, mtp, route_to_expert)


def run_group(job: GroupJob, out_dir: Path, timeout_s: float = 240) -> list[dict]:
    """Run ``job`` on its dp ranks (each its own process; they are killed if the test fails) and
    return what each rank wrote, by dp rank."""
    run_ranks(run_dp_rank, job.dp_size, (job, f"127.0.0.1:{free_port()}", str(out_dir)), timeout_s)
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(job.dp_size)]


def assert_holds_only_its_experts(result: dict, job: GroupJob) -> None:
    """A dp head (global rank ``dp_rank * tp``) holds, in its parameters and in the checkpoint
    tensors it loads, exactly its run of every MoE layer's experts, and fewer than all of them."""
    rank = result["dp_rank"] * job.tp
    assert result["experts"], "no MoE layer found"
    for layer in result["experts"]:
        start, stop = expert_range(layer["num_experts"], job.ep, rank)
        assert stop - start < layer["num_experts"], layer
        assert layer["held"] == [start, stop], layer
        assert layer["w13_experts"] == layer["w2_experts"] == stop - start, layer
        assert layer["checkpoint_experts"] == list(range(start, stop)), layer
    # every tp rank of the group, the workers the engine spawned included, reads its holding from its parameters
    num_experts = result["experts"][0]["num_experts"]
    want = [f"ep rank {rank + t} of {job.ep} holds routed experts {list(range(*expert_range(num_experts, job.ep, rank + t)))}"
            for t in range(job.tp)]
    assert [line.split(" in ")[0] for line in result["held_lines"]] == want, result["held_lines"]


def assert_group_agreed_to_stop(results: list[dict]) -> None:
    """Every rank left at the same vote with nothing left to run."""
    assert len({r["num_votes"] for r in results}) == 1, [r["num_votes"] for r in results]
    assert not any(r["has_unfinished"] for r in results)


# 1. greedy parity with tp 1

PARITY_SHAPES = [  # (model, tp, dp_size); R1 drafts with MTP
    pytest.param("deepseek-r1-tiny", 1, 2, id="r1-dp2"),
    pytest.param("deepseek-r1-tiny", 1, 4, id="r1-dp4", marks=pytest.mark.slow),
    pytest.param("deepseek-r1-tiny", 2, 2, id="r1-tp2xdp2"),
    pytest.param("qwen3-coder-tiny", 1, 2, id="coder-dp2", marks=pytest.mark.slow),
    pytest.param("qwen3-coder-tiny", 1, 4, id="coder-dp4", marks=pytest.mark.slow),
    pytest.param("qwen3-coder-tiny", 2, 2, id="coder-tp2xdp2", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("model,tp,dp_size", PARITY_SHAPES)
def test_dp_group_gives_tp1_greedy_tokens(model, tp, dp_size, tmp_path):
    mtp = resolve_model(model).num_mtp_layers > 0
    split = SPLIT[dp_size]
    job = GroupJob(model, tp, dp_size, prompts=tuple(tuple(PROMPTS[i] for i in mine) for mine in split), mtp=mtp)
    ref_tokens, ref_stats = reference(model, PROMPTS, mtp)
    results = run_group(job, tmp_path)
    for result, mine in zip(results, split):
        assert result["tokens"] == [ref_tokens[i] for i in mine], f"dp rank {result['dp_rank']}"
        assert_holds_only_its_experts(result, job)
    assert_group_agreed_to_stop(results)
    # the rank of the short prompt (and one without any) ran empty steps while the others decoded
    for result, mine in zip(results, split):
        if mine in ((SHORT_PROMPT,), ()):
            assert result["num_idle_steps"] > 0, result["dp_rank"]
    if mtp:  # drafting ran on the dp ranks, and its drafts were taken as the tp 1 engine's were
        assert ref_stats["num_accepted_tokens"] > 0, "the reference accepted no draft: nothing is compared"
        assert sum(r["num_drafts"] for r in results) > 0
        assert sum(r["num_accepted_tokens"] for r in results) > 0


@pytest.mark.parametrize("model", ["deepseek-r1-tiny", pytest.param("qwen3-coder-tiny", marks=pytest.mark.slow)])
def test_experts_over_one_engines_tp_ranks_give_tp1_greedy_tokens(model, tmp_path):
    """ep 2 at tp 2, dp 1: a prefill instance's form (its engine spawns its tp worker itself)."""
    mtp = resolve_model(model).num_mtp_layers > 0
    job = GroupJob(model, tp=2, dp_size=1, prompts=(PROMPTS,), mtp=mtp)
    (result,) = run_group(job, tmp_path)
    ref_tokens, _ = reference(model, PROMPTS, mtp)
    assert result["tokens"] == ref_tokens
    assert result["num_idle_steps"] is None  # no dp group: nothing to vote on
    # the tp worker's parameters are in its own process: this checks the head's (tp rank 0) half
    assert_holds_only_its_experts(result, job)
    if mtp:
        assert result["num_accepted_tokens"] > 0


# 2. every token to one expert


def test_every_token_routed_to_one_expert(tmp_path):
    """Every token of every MoE layer chooses expert 7 (rank 1's): the tokens equal tp 1 under the
    same routing, rank 1 runs every row and rank 0, whose experts nobody chose, receives none."""
    model, expert = "qwen3-coder-tiny", 7
    job = GroupJob(model, 1, 2, prompts=tuple(tuple(PROMPTS[i] for i in mine) for mine in SPLIT[2]),
                   route_to_expert=expert)
    ref_tokens, _ = reference(model, PROMPTS, False, expert)
    # the patch reaches the model: its tokens are not those of the model's own routing
    assert ref_tokens != reference(model, PROMPTS, False)[0]
    rank0, rank1 = run_group(job, tmp_path)
    assert expert_range(rank1["experts"][0]["num_experts"], 2, 1)[0] <= expert
    for result, mine in zip((rank0, rank1), SPLIT[2]):
        assert result["tokens"] == [ref_tokens[i] for i in mine], f"dp rank {result['dp_rank']}"
    c0, c1 = rank0["counters"], rank1["counters"]
    assert c0["rows_sent"] > 0 and c1["rows_sent"] > 0  # both ranks had tokens to send
    assert c0["rows_received"] == 0
    assert c1["rows_received"] == c0["rows_sent"] + c1["rows_sent"]
    assert c0["combine_payload_bytes"] == 0  # it ran no expert: nothing to send back
    assert c0["num_dispatches"] == c1["num_dispatches"] > 0  # yet it took part in every exchange


def test_routing_patch_needs_tp_1():
    with pytest.raises(ValueError, match="tp=1"):
        GroupJob("qwen3-coder-tiny", tp=2, dp_size=2, route_to_expert=0)


def test_route_every_token_to_restores_the_routers():
    from disaggsdk.engine.modeling.layers.moe import GroupLimitedRouter, SoftmaxTopKRouter

    before = (SoftmaxTopKRouter.forward, GroupLimitedRouter.forward)
    with route_every_token_to(3):
        assert (SoftmaxTopKRouter.forward, GroupLimitedRouter.forward) != before
    assert (SoftmaxTopKRouter.forward, GroupLimitedRouter.forward) == before


# 3. abort on one rank while the other decodes


@pytest.mark.parametrize("model", [
    "deepseek-r1-tiny", pytest.param("qwen3-coder-tiny", marks=pytest.mark.slow)])
def test_abort_on_one_rank_while_the_other_decodes(model, tmp_path):
    """Rank 0 aborts its two running requests after two steps, and a step later, idle by then,
    adds one more and another that it aborts before it ever runs; rank 1 decodes its request to
    the end. Both ranks drive their engines with step() and leave at the same vote; rank 1's
    tokens, and rank 0's late request's, are tp 1's."""
    mtp = resolve_model(model).num_mtp_layers > 0
    (p0, _), (p1, _), (p2, _), _, (p4, _) = PROMPTS
    work = ((p0, 24), (p1, 24), (p2, 24), (p4, 6))
    ref_tokens, _ = reference(model, work, mtp)
    events = (
        (Add(0, "a0", p0, 24), Add(0, "a1", p1, 24), Abort(2, ("a0", "a1")), Add(3, "late", p4, 6),
         Add(3, "never", p1, 24), Abort(3, ("never",))),
        (Add(0, "b0", p2, 24),),
    )
    rank0, rank1 = run_group(GroupJob(model, 1, 2, events=events, mtp=mtp), tmp_path)
    assert [r["num_events_done"] for r in (rank0, rank1)] == [6, 1]
    assert rank0["aborted"] == {"a0": True, "a1": True, "never": True}
    assert "never" not in rank0["step_tokens"]
    for rid, ref in (("a0", ref_tokens[0]), ("a1", ref_tokens[1])):
        assert rank0["last_output_step"][rid] < 2, rid  # nothing after the abort
        assert rid not in rank0["finish_reasons"]
        got = rank0["step_tokens"][rid]
        assert 0 < len(got) < 24 and got == ref[:len(got)], rid  # tp 1's tokens up to the abort
    assert rank0["step_tokens"]["late"] == ref_tokens[3]
    assert rank1["step_tokens"]["b0"] == ref_tokens[2]
    assert rank0["finish_reasons"]["late"] == rank1["finish_reasons"]["b0"] == "length"
    assert rank0["num_idle_steps"] > 0  # it ran empty steps after its late request finished
    assert_group_agreed_to_stop([rank0, rank1])


# 4. only one rank has work for 100 steps


def test_one_rank_works_alone_for_100_steps(tmp_path):
    model = "qwen3-coder-tiny"  # no drafting: one token per step, so 110 tokens take 110 steps
    prompt = PROMPTS[0][0]
    ref_tokens, _ = reference(model, ((prompt, 110),), False)
    events = ((Add(0, "alone", prompt, 110),), ())
    rank0, rank1 = run_group(GroupJob(model, 1, 2, events=events), tmp_path)
    assert rank0["step_tokens"]["alone"] == ref_tokens[0]
    assert rank1["num_idle_steps"] >= 100
    assert rank0["num_idle_steps"] == 0
    assert rank1["step_tokens"] == {}
    # the idle rank sent no row but took part in every MoE layer's exchange
    assert rank1["counters"]["rows_sent"] == 0
    assert rank1["counters"]["num_dispatches"] == rank0["counters"]["num_dispatches"] > 0
    assert_group_agreed_to_stop([rank0, rank1])


def test_a_stopping_rank_stops_the_whole_group(tmp_path):
    """Rank 1, told to stop (its unit is shutting down) while rank 0 decodes, says so in the next
    vote: both ranks leave after it (no MoE layer can run without rank 1), rank 0 with its request
    unfinished and its tokens so far tp 1's."""
    model = "qwen3-coder-tiny"
    prompt = PROMPTS[0][0]
    ref_tokens, _ = reference(model, ((prompt, 40),), False)
    events = ((Add(0, "long", prompt, 40),), (Stop(5),))
    rank0, rank1 = run_group(GroupJob(model, 1, 2, events=events), tmp_path)
    assert rank0["group_stopped"] and rank1["group_stopped"]
    assert rank0["num_votes"] == rank1["num_votes"] == 6  # five steps, then the vote that stopped them
    assert rank0["has_unfinished"]
    got = rank0["step_tokens"]["long"]
    assert len(got) == 5 and got == ref_tokens[0][:5]


# 5. settings the engine refuses


@pytest.mark.parametrize("config,model,match", [
    (EngineConfig(ep=2), "qwen3-tiny", r"qwen3-tiny has no routed experts to spread; use ep=1"),
    (EngineConfig(tp=2, ep=2), "qwen3-tiny", r"no routed experts.*use ep=1"),
    (EngineConfig(ep=3), "deepseek-r1-tiny", r"ep=3 must be 1 or tp \* dp_size = 1 \* 1 = 1"),
    (EngineConfig(tp=2, ep=2, dp_size=2, group_address="127.0.0.1:1"), "deepseek-r1-tiny",
     r"ep=2 must be 1 or tp \* dp_size = 2 \* 2 = 4"),
    (EngineConfig(dp_size=2, group_address="127.0.0.1:1"), "qwen3-coder-tiny",
     r"dp_size=2: .*set ep=2 and a group_address"),
    (EngineConfig(ep=2, dp_size=2), "qwen3-coder-tiny", r"set ep=2 and a group_address \(host:port\)"),
    (EngineConfig(dp_size=2), "qwen3-tiny", r"set ep=2 and a group_address"),
    (EngineConfig(ep=2, dp_rank=2, dp_size=2, group_address="127.0.0.1:1"), "deepseek-r1-tiny",
     r"dp_rank=2 is outside \[0, dp_size=2\)"),
])
def test_check_parallel_refuses_what_the_engine_cannot_run(config, model, match):
    with pytest.raises(EngineError, match=match):
        config.check_parallel(resolve_model(model))


@pytest.mark.parametrize("config", [
    EngineConfig(), EngineConfig(tp=2, ep=2), EngineConfig(ep=2, dp_size=2, group_address="127.0.0.1:1"),
    EngineConfig(tp=2, ep=4, dp_rank=1, dp_size=2, group_address="127.0.0.1:1"),
])
def test_check_parallel_accepts_ep_1_tp_and_tp_times_dp(config):
    config.check_parallel(resolve_model("deepseek-r1-tiny"))


def test_engine_refuses_ep_on_a_dense_model_before_it_starts_anything():
    with pytest.raises(EngineError, match="use ep=1"):
        LLMEngine("qwen3-tiny", EngineConfig(tp=2, ep=2))
