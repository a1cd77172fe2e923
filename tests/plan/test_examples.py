"""The acceptance examples of issue 2 on the real catalog models and the shipped specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from disaggsdk.models import resolve_model
from disaggsdk.plan import REPLICATED, expected_writes, make_plan, mla_dp_source
from tests.plan.helpers import make_spec

SPECS = Path(__file__).resolve().parents[2] / "specs"
TOKENS = 1024


def qwen_plan(p_tp, d_tp, **kw):
    return make_plan(make_spec(p_tp, d_tp, model="qwen3-coder", **kw))


def test_qwen3_coder_tp8_to_tp8_is_rank_to_peer_one_write_per_page_layer():
    plan = qwen_plan(8, 8, d_replicas=3)
    assert len(plan.routes) == 3
    for route in plan.routes:
        assert route.kind == "identical"
        pairs = [(t.src_tp_rank, t.dst_tp_rank) for t in route.transfers]
        assert pairs == [(i, i) for i in range(8)]
        assert all(t.heads == (i, i + 1) for i, t in enumerate(route.transfers))
        assert all(t.writes_per_page_layer == {"HND": 1, "NHD": 1} for t in route.transfers)
        # 1023 tokens move: 64 pages of 16, 62 layers, one write each; + 1 context write
        per_rank = [r.kv_writes for r in expected_writes(route, TOKENS, "HND").ranks]
        assert per_rank == [64 * 62] * 8


def test_prefill_tp8_decode_tp4_reconstructs_each_page_from_two_ranks():
    same = qwen_plan(8, 8).routes[0]
    route = qwen_plan(8, 4).routes[0]
    assert route.kind == "reconstruct"
    for dst in range(4):
        incoming = route.transfers_to(dst)
        assert [t.src_tp_rank for t in incoming] == [2 * dst, 2 * dst + 1]
        assert [t.heads for t in incoming] == [(2 * dst, 2 * dst + 1), (2 * dst + 1, 2 * dst + 2)]
    for layout in ("HND", "NHD"):
        four = expected_writes(route, TOKENS, layout).ranks
        eight = expected_writes(same, TOKENS, layout).ranks
        if layout == "HND":
            assert all(r.kv_writes == 2 * eight[0].kv_writes for r in four)
        else:  # a one-head slice of a two-head NHD page is one write per token
            assert all(r.kv_writes == 2 * 16 * eight[0].kv_writes for r in four)


def test_prefill_tp4_decode_tp8_splits_each_page_over_two_ranks():
    route = qwen_plan(4, 8).routes[0]
    assert route.kind == "split"
    for src in range(4):
        outgoing = [t for t in route.transfers if t.src_tp_rank == src]
        assert [t.dst_tp_rank for t in outgoing] == [2 * src, 2 * src + 1]
        assert all(t.writes_per_page_layer == {"HND": 1, "NHD": 16} for t in outgoing)


def test_qwen3_coder_tp16_decode_replica_sets_cover_every_prefill_rank():
    route = qwen_plan(8, 16, gpus_per_node=16).routes[0]
    assert route.kind == "replicate" and route.dst.num_replica_sets == 2
    assert sorted(t.src_tp_rank for t in route.transfers) == sorted(list(range(8)) * 2)


@pytest.mark.parametrize("d_tp", [8, 4])
def test_r1_every_rank_replicated_and_tp_routes_pair_ranks(d_tp):
    plan = make_plan(make_spec(8, d_tp, model="deepseek-r1", d_replicas=3, page_size=64))
    assert {r.kv_heads for i in plan.instances for r in i.ranks} == {REPLICATED}
    route = plan.routes[0]
    assert route.kind == "mla"
    if d_tp == 8:
        assert not route.source_per_request
        pairs = [(t.src_tp_rank, t.dst_tp_rank) for t in route.transfers]
        assert pairs == [(i, i) for i in range(8)]
    else:  # fewer decode ranks: pairs rotate per request so every prefill NIC gets used
        assert route.source_per_request
        pairs = {tuple((t.src_tp_rank, t.dst_tp_rank) for t in route.transfers_for(r)) for r in range(200)}
        assert all(len({s for s, _ in p}) == 4 for p in pairs)
        assert {s for p in pairs for s, _ in p} == set(range(8))
    arch = resolve_model("deepseek-r1")
    assert route.dst_shape.page_bytes == 64 * 576 * 2
    assert route.dst_shape.page_bytes * arch.num_layers // 64 == arch.kv_bytes_per_token("bfloat16")


def test_r1_prefill_tp8_to_data_parallel_decode_draws_one_source_per_request():
    plan = make_plan(make_spec(8, 1, model="deepseek-r1", d_dp=8, page_size=64))
    (route,) = plan.routes
    (decode,) = plan.decode
    assert decode.nodes == (1,) and [r.dp_rank for r in decode.ranks] == list(range(8))
    assert route.source_per_request and len(route.transfers) == 1
    sources = [mla_dp_source(route, f"req-{i}") for i in range(400)]
    assert set(sources) == set(range(8))
    assert sources == [mla_dp_source(route, f"req-{i}") for i in range(400)]  # deterministic
    # another seed draws differently, still deterministically
    other = make_plan(make_spec(8, 1, model="deepseek-r1", d_dp=8, page_size=64, seed=7)).routes[0]
    assert sources != [mla_dp_source(other, f"req-{i}") for i in range(400)]
    writes = expected_writes(route, TOKENS, "HND")
    assert (writes.kv_writes, writes.context_writes) == (16 * 61, 1)  # 1023 tokens: 16 pages of 64


def test_expected_writes_edge_token_counts():
    route = qwen_plan(8, 8).routes[0]
    for tokens, pages in [(0, 0), (1, 0), (2, 1), (17, 1), (18, 2)]:
        writes = expected_writes(route, tokens, "HND")
        assert writes.num_pages == pages
        assert writes.total == pages * 62 * 8 + (1 if pages else 0)
    with pytest.raises(ValueError, match="layout"):
        expected_writes(route, 10, "HDN")


@pytest.mark.parametrize("name", ["qwen3_coder", "r1_tp", "r1_dp", "tiny_local"])
def test_shipped_specs_plan(name):
    from disaggsdk.spec import load_spec

    plan = make_plan(load_spec(SPECS / f"{name}.yaml"))
    assert plan.routes and all(route.transfers for route in plan.routes)
    data = plan.to_json(num_tokens=TOKENS)
    if name in ("qwen3_coder", "r1_tp"):
        assert [len(r["transfers"]) for r in data["routes"]] == [8, 8, 8]
