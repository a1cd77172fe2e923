"""Placement of instances and ranks on nodes, GPUs and NICs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsdk.errors import SpecError
from disaggsdk.plan import make_plan
from tests.plan.helpers import make_spec


def test_small_instances_share_a_node_but_never_straddle():
    # 3-rank instances on 8-GPU nodes: two fit a node, the third moves to the next node
    plan = make_plan(make_spec(1, 1, model="qwen3-tiny", p_dp=3, d_dp=3, d_replicas=2))
    nodes = {i.name: i.nodes for i in plan.instances}
    assert nodes == {"prefill-0": (0,), "decode-0": (0,), "decode-1": (1,)}
    gpus = [r.gpu for r in plan.instance("decode-1").ranks]
    assert gpus == [0, 1, 2]


def test_instance_larger_than_a_node_spans_whole_nodes_from_a_fresh_one():
    plan = make_plan(make_spec(4, 16, model="qwen3-coder", d_replicas=2))
    assert [i.nodes for i in plan.instances] == [(0,), (1, 2), (3, 4)]
    ranks = plan.instance("decode-0").ranks
    assert [(r.node, r.gpu) for r in ranks[6:10]] == [(1, 6), (1, 7), (2, 0), (2, 1)]


def test_nearest_nic_spreads_gpus_evenly():
    plan = make_plan(make_spec(8, 8, nics_per_node=2))
    assert [r.nic for r in plan.instances[0].ranks] == [0, 0, 0, 0, 1, 1, 1, 1]
    plan = make_plan(make_spec(1, 1, model="qwen3-tiny", p_dp=4, gpus_per_node=4, nics_per_node=8))
    assert [r.nic for r in plan.instances[0].ranks] == [0, 2, 4, 6]


def test_dp_groups_are_contiguous_tp_groups():
    plan = make_plan(make_spec(2, 2, model="qwen3-coder", d_dp=4))
    decode = plan.instance("decode-0")
    assert [(r.dp_rank, r.tp_rank) for r in decode.ranks[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert decode.rank_of(3, 1) is decode.ranks[7]
    assert [r.kv_heads for r in decode.ranks[:4]] == [(0, 4), (4, 8), (0, 4), (4, 8)]


def test_instance_neither_within_nor_whole_nodes_is_a_spec_error():
    with pytest.raises(SpecError, match=r"\$\.decode.*multiple of 8"):
        make_plan(make_spec(8, 4, model="qwen3-coder", d_dp=3))


def test_tp_incompatible_with_kv_heads_is_a_spec_error():
    with pytest.raises(SpecError, match=r"\$\.prefill\.tp: tp=3 .* 8 KV heads"):
        make_plan(make_spec(3, 8, model="qwen3-coder"))


@settings(max_examples=100, deadline=None)
@given(
    gpn=st.sampled_from([1, 2, 4, 8]),
    p=st.tuples(st.integers(1, 3), st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([1, 2])),
    d=st.tuples(st.integers(1, 3), st.sampled_from([1, 2, 4, 8, 16]), st.sampled_from([1, 2])),
)
def test_every_rank_gets_its_own_device(gpn, p, d):
    size_p, size_d = p[1] * p[2], d[1] * d[2]
    if any(s > gpn and s % gpn for s in (size_p, size_d)):
        return  # the spec rules reject these; tested above
    spec = make_spec(
        p[1], d[1], model="qwen3-coder", p_replicas=p[0], p_dp=p[2], d_replicas=d[0], d_dp=d[2],
        gpus_per_node=gpn, nics_per_node=max(1, gpn // 2),
    )
    plan = make_plan(spec)
    ranks = [r for i in plan.instances for r in i.ranks]
    assert [r.index for r in ranks] == list(range(len(ranks)))
    assert len({(r.node, r.gpu) for r in ranks}) == len(ranks)
    assert all(0 <= r.gpu < gpn and r.nic == r.gpu * max(1, gpn // 2) // gpn for r in ranks)
    for inst in plan.instances:
        size = inst.tp * inst.dp
        assert len(inst.nodes) == max(1, size // gpn)  # within one node, or whole nodes
        if size >= gpn:
            assert inst.ranks[0].gpu == 0
    assert [i.role for i in plan.instances] == ["prefill"] * p[0] + ["decode"] * d[0]
