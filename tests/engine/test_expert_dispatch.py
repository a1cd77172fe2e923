"""Expert-parallel dispatch / combine (engine.expert_parallel): the expert map agrees with the
memory plan; the one-process reference equals a dense MoE; the gloo all-to-all dispatcher, over
real processes, equals the reference row for row and the dense MoE, and counts what it moved as
the reference says it must. The same comparison on NCCL is behind the `gpu` marker."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from expert_dispatch_worker import (
    NUM_LAYERS,
    SCENARIOS,
    dense_moe,
    run_local_experts,
    run_rank,
    scenario,
)

from disaggsdk.engine.expert_parallel import (
    AllToAllCounters,
    ExpertMap,
    ExpertParallelError,
    create_dispatcher,
)
from disaggsdk.engine.expert_parallel.torch_ref import ReferenceDispatch
from disaggsdk.plan.memory import expert_range
from tests.declared_skips import no_gpu
from tests.spawned_ranks import free_port, run_ranks

# the expert map


@pytest.mark.parametrize("num_experts,ep", [(n, ep) for n in (1, 3, 6, 8, 64, 256, 257) for ep in (1, 2, 3, 4, 8)])
def test_expert_map_agrees_with_the_memory_plan(num_experts, ep):
    expert_map = ExpertMap(num_experts, ep)
    sizes = [expert_map.num_local_experts(r) for r in range(ep)]
    assert [expert_map.expert_range(r) for r in range(ep)] == [expert_range(num_experts, ep, r) for r in range(ep)]
    # vLLM's map: contiguous runs covering every expert once, the first num_experts % ep ranks one more
    assert sum(sizes) == num_experts
    assert sizes == [num_experts // ep + (1 if r < num_experts % ep else 0) for r in range(ep)]
    rank_table, local_table = expert_map.rank_table().tolist(), expert_map.local_table().tolist()
    for expert in range(num_experts):
        rank, local = expert_map.locate(expert)
        start, stop = expert_range(num_experts, ep, rank)
        assert start <= expert < stop and local == expert - start
        assert (rank_table[expert], local_table[expert]) == (rank, local)
    for rank in range(ep):
        table = expert_map.global_to_local(rank).tolist()
        start, stop = expert_map.expert_range(rank)
        assert table == [e - start if start <= e < stop else -1 for e in range(num_experts)]


def test_expert_map_six_experts_over_four_ranks():
    expert_map = ExpertMap(6, 4)
    assert [expert_map.expert_range(r) for r in range(4)] == [(0, 2), (2, 4), (4, 5), (5, 6)]
    assert expert_map.global_to_local(2).tolist() == [-1, -1, -1, -1, 0, -1]
    assert expert_map.locate(5) == (3, 0)


def test_expert_map_refuses_bad_counts_and_ids():
    with pytest.raises(ValueError, match="ep_size >= 1"):
        ExpertMap(8, 0)
    with pytest.raises(ValueError, match="outside"):
        ExpertMap(8, 2).locate(8)
    with pytest.raises(ValueError, match="outside"):
        ExpertMap(8, 2).expert_range(2)


def test_unknown_dispatcher_names_the_known_ones():
    with pytest.raises(ExpertParallelError, match="all_to_all"):
        create_dispatcher("deepep-typo", ExpertMap(8, 2), 0)


# the reference against a dense MoE, in one process


def reference_run(s, num_layers: int = 1):
    """Dispatch, the experts, combine through the reference: (received per rank, combined per rank, ref)."""
    ref = ReferenceDispatch(s.expert_map)
    for _ in range(num_layers):
        tokens = ref.dispatch_all(s.hidden, s.topk_ids, s.topk_weights)
        outs = [run_local_experts(t.hidden, t.local_expert_ids, s.expert_map, r) for r, t in enumerate(tokens)]
        combined = ref.combine_all(outs, [t.handle for t in tokens])
    return tokens, combined, ref


def assert_equals_dense(s, combined):
    for rank in range(s.expert_map.ep_size):
        dense = dense_moe(s.hidden[rank], s.topk_ids[rank], s.topk_weights[rank], s.expert_map.num_experts)
        tol = 2e-2 if s.hidden[rank].dtype == torch.bfloat16 else 1e-5
        assert combined[rank].shape == s.hidden[rank].shape and combined[rank].dtype == s.hidden[rank].dtype
        torch.testing.assert_close(combined[rank].double(), dense, atol=tol, rtol=tol)


@pytest.mark.parametrize("ep", [1, 2, 3, 4])
@pytest.mark.parametrize("name", SCENARIOS)
def test_reference_equals_a_dense_moe(name, ep):
    s = scenario(name, ep)
    tokens, combined, _ = reference_run(s)
    assert_equals_dense(s, combined)
    for rank, t in enumerate(tokens):  # every received row is for one of this rank's experts
        assert t.hidden.shape[0] == t.local_expert_ids.shape[0] == sum(t.handle.recv_splits)
        assert ((t.local_expert_ids >= 0) & (t.local_expert_ids < s.expert_map.num_local_experts(rank))).all()


def test_reference_sum_does_not_depend_on_ep():
    """The same routing and experts give bitwise the same output at ep 1, 2 and 4 (slot order)."""
    s1 = scenario("random", 4)
    outs = []
    for ep in (1, 2, 4):
        # one rank's tokens dispatched over groups of different sizes (the other ranks send none)
        expert_map = ExpertMap(s1.expert_map.num_experts, ep)
        empty = lambda t: t[:0]  # noqa: E731
        s = dataclasses.replace(s1, expert_map=expert_map,
                                hidden=[s1.hidden[0]] + [empty(s1.hidden[0])] * (ep - 1),
                                topk_ids=[s1.topk_ids[0]] + [empty(s1.topk_ids[0])] * (ep - 1),
                                topk_weights=[s1.topk_weights[0]] + [empty(s1.topk_weights[0])] * (ep - 1))
        outs.append(reference_run(s)[1][0])
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_counters_since_and_copy():
    counters = AllToAllCounters(num_dispatches=1, dispatch_payload_bytes=100, combine_payload_bytes=50)
    earlier = counters.copy()
    counters.num_dispatches += 2
    counters.combine_payload_bytes += 7
    step = counters.since(earlier)
    assert (step.num_dispatches, step.dispatch_payload_bytes, step.combine_payload_bytes) == (2, 0, 7)
    assert earlier.num_dispatches == 1 and counters.payload_bytes == 157
    counters.exchange_s += 0.25
    assert counters.since(earlier).exchange_s == 0.25 and earlier.exchange_s == 0.0
    assert "exchange_s" not in counters.counts() and counters.counts()["combine_payload_bytes"] == 57


def test_reference_counts_what_it_would_move():
    s = scenario("every_token_to_one_expert", 4)  # all rows go to rank 3
    _, _, ref = reference_run(s)
    row_bytes = s.hidden[0].shape[1] * 4
    for rank, counters in enumerate(ref.counters):
        num_rows = s.hidden[rank].shape[0]
        remote = 0 if rank == 3 else num_rows
        assert counters.dispatch_payload_bytes == remote * row_bytes
        # combine bytes are the expert rank's: it sends every other rank's outputs back
        returned = sum(h.shape[0] for h in s.hidden[:3]) if rank == 3 else 0
        assert counters.combine_payload_bytes == returned * row_bytes
        assert counters.metadata_bytes == 3 * 8 + remote * 8
        assert counters.num_all_to_all_calls == 4 and counters.num_dispatches == counters.num_combines == 1
    assert ref.counters[3].rows_received == sum(h.shape[0] for h in s.hidden)


# the gloo all-to-all dispatcher over real processes


def run_group(ep: int, out_dir, backend: str = "gloo", timeout_s: float = 240) -> list[dict]:
    """Start ``ep`` ranks running every scenario; return each rank's saved results (no process
    outlives the test: `tests.spawned_ranks.run_ranks`)."""
    run_ranks(run_rank, ep, (ep, free_port(), str(out_dir), backend), timeout_s)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(ep)]


def counted(saved: dict) -> dict:
    """A saved `AllToAllCounters` (``dataclasses.asdict``) without its measured time: its `counts`."""
    return {name: value for name, value in saved.items() if name != "exchange_s"}


def assert_group_equals_reference(results: list[dict], ep: int) -> None:
    for name in SCENARIOS:
        s = scenario(name, ep)
        tokens, combined, ref = reference_run(s, NUM_LAYERS)
        one_layer = reference_run(s)[2].counters
        for rank in range(ep):
            got = results[rank][name]
            for layer in got["layers"]:  # both layers route alike: each must equal the reference
                assert layer["recv_splits"] == tokens[rank].handle.recv_splits, (name, rank)
                assert torch.equal(layer["hidden"], tokens[rank].hidden), (name, rank)
                assert torch.equal(layer["local_expert_ids"], tokens[rank].local_expert_ids), (name, rank)
                assert torch.equal(layer["combined"], combined[rank]), (name, rank)
                assert counted(layer["counters"]) == one_layer[rank].counts(), (name, rank)  # via `since`
                assert layer["counters"]["exchange_s"] > 0  # every rank joins every collective, and waits in it
            # measured from the buffers sent, over both layers, equal to what the reference says
            total = ref.counters[rank].counts()
            assert counted(got["counters"]) == total, (name, rank, got["counters"], total)
            assert got["counters"]["exchange_s"] == pytest.approx(sum(la["counters"]["exchange_s"] for la in got["layers"]))
            assert got["counters"]["num_all_to_all_calls"] == 4 * NUM_LAYERS
        assert_equals_dense(s, [results[r][name]["layers"][-1]["combined"] for r in range(ep)])
        if name == "only_local_experts":
            assert all(results[r][name]["counters"]["dispatch_payload_bytes"] == 0 for r in range(ep))
        if name == "one_rank_sends_nothing":
            assert results[ep - 1][name]["layers"][0]["hidden"].shape[0] == 0
            assert results[1][name]["layers"][0]["combined"].shape == (0, s.hidden[0].shape[1])
    for rank in range(ep):
        assert "ep_size" in results[rank]["wrong_size"]


@pytest.mark.parametrize("ep", [2, 4])
def test_gloo_all_to_all_equals_the_reference_and_a_dense_moe(ep, tmp_path):
    assert_group_equals_reference(run_group(ep, tmp_path), ep)


@pytest.mark.gpu
def test_nccl_all_to_all_equals_the_reference(tmp_path):
    """The same class on a NCCL group, one GPU per rank (a single GPU runs ep 1: the NCCL path
    with the exchange to itself)."""
    if not torch.cuda.is_available():
        pytest.skip(no_gpu("needs an NVIDIA GPU"))
    ep = min(torch.cuda.device_count(), 4)
    assert_group_equals_reference(run_group(ep, tmp_path, backend="nccl"), ep)
