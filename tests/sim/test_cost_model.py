"""The cost model's physics: memory-bound decode, compute-bound prefill, transfer overlap."""

import pytest

from disaggsdk.models import resolve_model
from disaggsdk.plan import make_plan
from disaggsdk.sim.cost_model import StepCostModel, prefill_context_pairs, transfer_cost_from_route
from disaggsdk.sim.hardware import load_profile, profile_names
from disaggsdk.spec import load_spec

H200 = load_profile("h200")
R1 = resolve_model("deepseek-r1")


def test_profiles_ship_with_sources():
    assert {"h100", "h200"} <= set(profile_names())
    assert "datasheet" in H200.sources["gpu"]
    assert load_profile("h100").hbm_gb_per_s < H200.hbm_gb_per_s


def test_distinct_experts_between_top_k_and_all():
    m = StepCostModel(R1, H200, tp=8, weight_dtype="fp8")
    assert m.distinct_experts(1) == pytest.approx(8)
    assert m.distinct_experts(100_000) == pytest.approx(256)
    assert m.distinct_experts(8) < 64


def test_r1_fp8_weights_fill_about_85_gb_of_each_gpu_at_tp8():
    m = StepCostModel(R1, H200, tp=8, weight_dtype="fp8")
    assert 80e9 < m.weight_bytes_per_device() < 90e9  # 671B params / 8 GPUs
    assert m.kv_capacity_tokens() > 500_000


def test_single_token_decode_is_memory_bound_and_batching_is_nearly_free_at_first():
    m = StepCostModel(R1, H200, tp=8, weight_dtype="fp8")
    one = m.step_time_s(1, 1, 1000, 1000)
    two = m.step_time_s(2, 2, 2000, 2000)
    assert two < 1.5 * one  # a second sequence costs far less than a second step


def test_long_prefill_is_compute_bound_and_scales_with_tokens():
    m = StepCostModel(R1, H200, tp=8, weight_dtype="fp8")
    t4k = m.step_time_s(4096, 1, prefill_context_pairs(4096, 0), 4096)
    t8k = m.step_time_s(8192, 1, prefill_context_pairs(8192, 0), 8192)
    assert 1.8 < t8k / t4k < 2.6


def test_context_pairs_of_a_causal_chunk():
    assert prefill_context_pairs(1, 0) == 1
    assert prefill_context_pairs(4, 0) == 1 + 2 + 3 + 4
    assert prefill_context_pairs(2, 10) == 11 + 12


def test_streamed_transfer_exposes_one_layer_of_the_whole():
    spec = load_spec("specs/r1_tp.yaml")
    plan = make_plan(spec)
    route = plan.route("prefill-0", "decode-0")
    cost = transfer_cost_from_route(route, H200, "HND", spec.kv.page_size)
    assert cost.num_nics == 8
    # every decode rank receives the whole latent: 8 copies of 70,272 B per token over 8 NICs
    assert cost.bytes_per_token == pytest.approx(8 * 70_272)
    total = cost.total_s(4096)
    assert cost.exposed_s(4096, streaming=False) == total
    assert cost.exposed_s(4096, streaming=True) == pytest.approx(total / 61)
