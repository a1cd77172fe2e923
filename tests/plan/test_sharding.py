"""KV sharding rules, checked against the engine's own head ranges."""

from __future__ import annotations

import pytest

from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.errors import SpecError
from disaggsdk.plan import REPLICATED, make_sharding


@pytest.mark.parametrize("heads", range(1, 17))
def test_gqa_head_ranges_agree_with_the_engine(heads):
    for tp in range(1, 17):
        if heads % tp and tp % heads:
            continue
        sharding = make_sharding("gqa", tp, heads)
        for rank in range(tp):
            assert sharding.kv_heads(rank) == TensorParallel(rank, tp).kv_head_range(heads)


def test_replica_sets_each_hold_a_full_copy():
    sharding = make_sharding("gqa", 16, 4)
    assert sharding.num_replica_sets == 4
    for s in range(4):
        members = [r for r in range(16) if sharding.replica_set(r) == s]
        assert members == [s, s + 4, s + 8, s + 12]
        assert sorted(sharding.kv_heads(r) for r in members) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert make_sharding("gqa", 4, 8).replica_set(3) is None


def test_mla_is_replicated_on_every_rank():
    sharding = make_sharding("mla", 8, 1)
    assert [sharding.kv_heads(r) for r in range(8)] == [REPLICATED] * 8
    assert sharding.replica_set(5) is None and sharding.num_replica_sets == 8


def test_bad_tp_names_the_path_and_the_fix():
    with pytest.raises(SpecError, match=r"\$\.decode\.tp: tp=3 .* use one of \[1, 2, 4, 8\]"):
        make_sharding("gqa", 3, 8, "$.decode.tp")
    with pytest.raises(SpecError, match="at least 1"):
        make_sharding("mla", 0, 1)
