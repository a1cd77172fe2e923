"""RooflineKernels: the cost model's formulas one kernel at a time, every shape answered."""

import pytest

from disaggsdk.models import resolve_model
from disaggsdk.sim.all_to_all import all_to_all_bytes_per_step, all_to_all_time_s
from disaggsdk.sim.cost_model import StepCostModel
from disaggsdk.sim.hardware import load_profile
from disaggsdk.sim.kernels import (
    AllReduce,
    Elementwise,
    ExpertExchange,
    Gemm,
    MoeExperts,
    attention_shape,
    gemm_dtype,
)
from disaggsdk.sim.roofline_kernels import RooflineKernels

H200 = load_profile("h200")
ROOF = RooflineKernels(H200)
R1 = resolve_model("deepseek-r1")
QWEN = resolve_model("qwen3-coder")
FLOPS_BF16 = H200.bf16_tflops * 1e12 * H200.flops_efficiency
FLOPS_FP8 = H200.fp8_tflops * 1e12 * H200.flops_efficiency
HBM = H200.hbm_gb_per_s * 1e9 * H200.bandwidth_efficiency


def test_every_answer_names_the_roofline_of_its_profile():
    for time in (ROOF.gemm(Gemm(1, 1, 1)), ROOF.elementwise(Elementwise("rmsnorm", 1, 7168)),
                 ROOF.attention(attention_shape(R1, "generation", 8, 1, 1, 0))):
        assert time.fit == "roofline" and time.source == "roofline (profile h200)" and time.seconds > 0


def test_a_large_gemm_is_compute_bound_and_a_skinny_one_reads_its_weights():
    big = ROOF.gemm(Gemm(8192, 7168, 7168, "fp8_block"))
    assert big.seconds == pytest.approx(2 * 8192 * 7168 * 7168 / FLOPS_FP8)
    skinny = ROOF.gemm(Gemm(1, 7168, 7168, "bfloat16"))
    assert skinny.seconds == pytest.approx((7168 * 7168 * 2 + 7168 * 2 + 7168 * 2) / HBM)
    assert gemm_dtype("fp8") == "fp8_block" and gemm_dtype("float32") == "bfloat16"


def test_tp_all_reduce_is_the_cost_models_ring_over_nvlink():
    cost = StepCostModel(QWEN, H200, tp=8)
    tokens = 512
    ring = ROOF.collective(AllReduce(ranks=8, elements=tokens * QWEN.hidden_size))
    assert ring.seconds == pytest.approx(cost._allreduce_s(tokens))
    across_nodes = ROOF.collective(AllReduce(ranks=16, elements=tokens * QWEN.hidden_size, nodes=2))
    assert across_nodes.seconds > ring.seconds  # bound by the NICs


def test_expert_exchange_on_one_node_sums_to_the_all_to_all_term():
    tokens, ep = 512, 8  # the instance's step: each of the 8 ranks dispatches 64
    traffic = all_to_all_bytes_per_step(R1, 1, ep, ep, tokens)
    per_layer = sum(ROOF.collective(ExpertExchange(phase, "normal", tokens // ep, R1.hidden_size, R1.num_experts_per_tok,
                                                   R1.num_experts, ranks=ep)).seconds
                    for phase in ("dispatch", "combine"))
    assert per_layer * traffic.num_moe_layers == pytest.approx(all_to_all_time_s(traffic, H200))


def test_an_exchange_spanning_nodes_sends_its_off_node_share_over_the_nics():
    def dispatch(nodes):
        return ROOF.collective(ExpertExchange("dispatch", "low_latency", 128, 7168, 8, 256, ranks=8 * nodes, nodes=nodes))
    nvlink = H200.nvlink_gb_per_s * 1e9 * H200.nvlink_efficiency
    nic_share = H200.nic_bytes_per_s * H200.nics_per_node / 8  # 8 ranks a node share its 8 NICs
    pairs = 128 * 8
    row_and_id = 7168 * 2 + 8  # a bf16 row and its int64 expert id
    on_node, off_node = 7 / 16, 8 / 16  # shares of the pairs bound for this node's other ranks, for the other node
    # and a split count to each peer: 7 on this node, 8 on the other
    expected = (pairs * on_node * row_and_id + 8 * 7) / nvlink + (pairs * off_node * row_and_id + 8 * 8) / nic_share
    assert dispatch(2).seconds == pytest.approx(expected + 3 * H200.allreduce_latency_us * 1e-6)
    assert dispatch(2).seconds > 2.5 * dispatch(1).seconds
    assert dispatch(9).seconds > dispatch(8).seconds


def test_decode_attention_reads_the_kv_and_mla_decode_reads_the_latent():
    gqa = ROOF.attention(attention_shape(QWEN, "generation", 8, 64, 1, 4095))
    kv_bytes = 64 * 4096 * 2 * 1 * 128 * 2  # sequences x positions x (K, V) x 1 KV head at tp 8 x head_dim x bf16
    assert gqa.seconds == pytest.approx(kv_bytes / HBM)
    mla = ROOF.attention(attention_shape(R1, "generation", 8, 64, 1, 4095, kv_dtype="fp8"))
    assert mla.seconds == pytest.approx(max(64 * 4096 * 576 / HBM, 2 * 16 * (2 * 512 + 64) * 64 * 4096 / FLOPS_BF16))


def test_prefill_attention_counts_causal_pairs_after_the_cached_prefix():
    first = ROOF.attention(attention_shape(QWEN, "context", 8, 1, 4096, 0))
    second = ROOF.attention(attention_shape(QWEN, "context", 8, 1, 4096, 4096))
    pairs_first, pairs_second = 4096 * 4097 // 2, 4096 * 4096 + 4096 * 4097 // 2
    assert first.seconds == pytest.approx(2 * 12 * 256 * pairs_first / FLOPS_BF16)
    assert second.seconds / first.seconds == pytest.approx(pairs_second / pairs_first)


def test_moe_experts_compute_their_routes_and_read_the_experts_they_hit():
    tp8 = MoeExperts(num_tokens=8192, hidden_size=7168, inter_size=2048, topk=8, num_experts=256, moe_tp=8, dtype="fp8_block")
    assert ROOF.moe_experts(tp8).seconds == pytest.approx(2 * 8192 * 8 * 3 * 7168 * 2048 / 8 / FLOPS_FP8)
    one = MoeExperts(num_tokens=1, hidden_size=7168, inter_size=2048, topk=8, num_experts=256, moe_ep=8, dtype="fp8_block")
    assert ROOF.moe_experts(one).seconds == pytest.approx(8 * 3 * 7168 * 2048 / 8 / HBM)


def test_shapes_refuse_empty_work():
    with pytest.raises(ValueError):
        Gemm(0, 128, 128)
    with pytest.raises(ValueError):
        AllReduce(ranks=1, elements=10)
