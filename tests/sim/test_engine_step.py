"""A GPU step composed kernel by kernel (`sim.engine_step`), against layers summed by hand."""

from __future__ import annotations

from collections import Counter

import pytest

from disaggsdk.models import resolve_model
from disaggsdk.sim.cost_model import StepCostModel
from disaggsdk.sim.engine_step import EngineStep, captured_batch, split_over_groups
from disaggsdk.sim.hardware import load_profile
from disaggsdk.sim.kernels import (
    AllReduce,
    Attention,
    Collective,
    Elementwise,
    ExpertExchange,
    Gemm,
    KernelTime,
    MoeExperts,
)
from disaggsdk.sim.roofline_kernels import RooflineKernels
from disaggsdk.sim.step_batch import StepBatch

US = 1e-6


class CountingKernels:
    """Kernel times simple enough to sum by hand, and every call counted by shape."""

    def __init__(self) -> None:
        self.calls: Counter[object] = Counter()

    def _t(self, shape: object, seconds: float) -> KernelTime:
        self.calls[shape] += 1
        return KernelTime(seconds, "hand", "exact")

    def gemm(self, shape: Gemm) -> KernelTime:
        return self._t(shape, US * shape.batch * shape.m * shape.n * shape.k / 1e6)

    def attention(self, shape: Attention) -> KernelTime:
        return self._t(shape, US * shape.context_pairs)

    def moe_experts(self, shape: MoeExperts) -> KernelTime:
        return self._t(shape, US * shape.num_tokens)

    def collective(self, shape: Collective) -> KernelTime:
        return self._t(shape, 5 * US if isinstance(shape, AllReduce) else 7 * US)

    def elementwise(self, shape: Elementwise) -> KernelTime:
        return self._t(shape, US * shape.tokens * shape.width / 1e3)

    def sources(self) -> dict[str, str]:
        return {}


def gemm_s(m: int, n: int, k: int, batch: int = 1) -> float:
    return US * batch * m * n * k / 1e6


def test_a_dense_gqa_step_is_the_sum_of_its_kernels_by_hand():
    arch = resolve_model("qwen3-tiny")  # 4 layers, hidden 256, 8 heads, 4 kv heads of 32, inter 512, vocab 4096
    h, d, inter, vocab = arch.hidden_size, arch.head_dim, arch.intermediate_size, arch.vocab_size
    step = EngineStep(arch, CountingKernels(), tp=2, launch_overhead_s_per_layer=3 * US, step_overhead_s=11 * US)
    batch = StepBatch(decode_seqs=2, decode_context_tokens=20, chunks=((5, 3),))
    tokens, seqs = 2 + 5, 3
    heads, kv_heads = 8 // 2, 4 // 2
    layer = (2 * US * tokens * h / 1e3  # two rmsnorms
             + gemm_s(tokens, (heads + 2 * kv_heads) * d, h) + gemm_s(tokens, h, heads * d)  # qkv, o
             + US * (5 * 3 + 5 * 6 / 2)  # the chunk's attention: 5 queries after 3 cached
             + US * 2 * 1 * (10 + 1)  # decode: 2 sequences, 1 query each after 10 tokens
             + 5 * US  # all-reduce after attention
             + gemm_s(tokens, 2 * inter // 2, h) + gemm_s(tokens, h, inter // 2)  # gate_up, down
             + US * tokens * (inter // 2) / 1e3  # SiLU-and-mul
             + 5 * US)  # all-reduce after the MLP
    once = US * tokens * h / 1e3 + US * seqs * h / 1e3 + gemm_s(seqs, vocab // 2, h)  # embedding, final norm, head
    want = arch.num_layers * (layer + 3 * US) + once + 11 * US  # a step with prefill is not a CUDA graph
    assert step.batch_time_s(batch) == pytest.approx(want, rel=1e-12)
    assert sum(step.breakdown(batch).values()) == pytest.approx(want, rel=1e-12)


def test_a_decode_only_step_runs_its_cuda_graph_padded_and_without_launch_overhead():
    arch = resolve_model("qwen3-tiny")
    kernels = CountingKernels()
    step = EngineStep(arch, kernels, launch_overhead_s_per_layer=1.0)
    step.batch_time_s(StepBatch(decode_seqs=5, decode_context_tokens=50))
    decode = [s for s in kernels.calls if isinstance(s, Attention)]
    assert [(s.phase, s.batch, s.cached_tokens) for s in decode] == [("generation", 8, 10)]  # 5 padded to 8
    assert step.breakdown(StepBatch(decode_seqs=5, decode_context_tokens=50)).get("launch") is None
    eager = EngineStep(arch, CountingKernels(), launch_overhead_s_per_layer=1.0, cuda_graph_max_batch=4)
    assert eager.breakdown(StepBatch(decode_seqs=5, decode_context_tokens=50))["launch"] == arch.num_layers
    assert [captured_batch(n, 256) for n in (1, 2, 3, 4, 5, 8, 9, 250, 256, 257)] == [1, 2, 4, 4, 8, 8, 16, 256, 256, None]


def test_expert_parallel_moe_exchanges_tokens_and_overlap_hides_the_shorter_side():
    arch = resolve_model("deepseek-r1-tiny")  # MLA, 8 experts top-2, one shared, the first layer dense
    decode_only = StepBatch(decode_seqs=8, decode_context_tokens=800, tokens_per_decode_seq=2)
    kernels = CountingKernels()
    step = EngineStep(arch, kernels, dp=4, ep=4, weight_dtype="fp8_block")
    times = step.breakdown(decode_only)
    exchanges = [s for s in kernels.calls if isinstance(s, ExpertExchange)]
    # DeepEP dispatches in FP8 and combines in bfloat16, within the node here
    assert {(s.phase, s.mode, s.tokens, s.ranks, s.nodes, s.dtype) for s in exchanges} == {
        ("dispatch", "low_latency", 4, 4, 1, "fp8"), ("combine", "low_latency", 4, 4, 1, "bfloat16")}
    moe_layers = arch.num_layers - arch.first_k_dense
    assert times["ep_dispatch"] == pytest.approx(moe_layers * 7 * US)
    experts = [s for s in kernels.calls if isinstance(s, MoeExperts)]
    assert {(s.num_tokens, s.moe_ep, s.deepep, s.phase) for s in experts} == {(16, 4, True, "generation")}
    # MLA decode: the absorbed q and o products batched over the heads on the device
    assert {s.batch for s in kernels.calls if isinstance(s, Gemm) and s.batch > 1} == {arch.num_attention_heads}
    with_prefill = StepBatch(decode_seqs=8, decode_context_tokens=800, chunks=((64, 0),))
    normal = CountingKernels()
    EngineStep(arch, normal, dp=4, ep=4).batch_time_s(with_prefill)
    assert {s.mode for s in normal.calls if isinstance(s, ExpertExchange)} == {"normal"}

    overlapped = EngineStep(arch, CountingKernels(), dp=4, ep=4, weight_dtype="fp8_block", two_batch_overlap=True)
    plain = step.batch_time_s(decode_only)
    hidden = overlapped.breakdown(decode_only)["two_batch_overlap"]
    assert hidden == pytest.approx(-moe_layers * 14 * US)  # the exchange (7 + 7 us) is the shorter side here
    assert overlapped.batch_time_s(decode_only) == pytest.approx(plain + hidden)
    # the stated imbalance scales the routed experts alone
    skewed = EngineStep(arch, CountingKernels(), dp=4, ep=4, weight_dtype="fp8_block", expert_imbalance=1.5)
    assert skewed.batch_time_s(decode_only) - plain == pytest.approx(0.5 * times["moe_experts"])


def test_groups_wider_than_a_node_exchange_and_reduce_across_nodes():
    arch = resolve_model("deepseek-r1-tiny")
    kernels = CountingKernels()
    EngineStep(arch, kernels, tp=4, dp=18, ep=72, gpus_per_node=8).batch_time_s(StepBatch(72 * 4, 72 * 4 * 100.0))
    assert {s.nodes for s in kernels.calls if isinstance(s, ExpertExchange)} == {9}
    assert {s.nodes for s in kernels.calls if isinstance(s, AllReduce)} == {1}
    wide_tp = CountingKernels()
    EngineStep(arch, wide_tp, tp=16, gpus_per_node=8).batch_time_s(StepBatch(4, 400.0))
    assert {(s.ranks, s.nodes) for s in wide_tp.calls if isinstance(s, AllReduce)} == {(16, 2)}


def test_mtp_charges_its_draft_layer_on_decode_steps():
    arch = resolve_model("deepseek-r1-tiny")
    batch = StepBatch(decode_seqs=4, decode_context_tokens=400, tokens_per_decode_seq=2)
    plain = EngineStep(arch, CountingKernels(), weight_dtype="fp8_block").breakdown(batch)
    mtp = EngineStep(arch, CountingKernels(), weight_dtype="fp8_block", mtp_layers=1).breakdown(batch)
    layers = arch.num_layers - arch.first_k_dense
    assert mtp["moe_experts"] == pytest.approx(plain["moe_experts"] * (layers + 1) / layers)


def test_dp_groups_share_the_batch_and_the_slowest_sets_the_step():
    batch = StepBatch(decode_seqs=10, decode_context_tokens=1000, chunks=((300, 0), (200, 100), (50, 0)))
    groups = split_over_groups(batch, 4)
    assert [g.decode_seqs for g in groups] == [3, 3, 2, 2]
    assert sum(g.decode_context_tokens for g in groups) == pytest.approx(1000)
    assert sorted(c for g in groups for c in g.chunks) == sorted(batch.chunks)
    # the largest chunks first, each to the group with the fewest tokens so far (decode tokens count)
    assert [g.chunks for g in groups] == [((50, 0),), (), ((300, 0),), ((200, 100),)]
    arch = resolve_model("qwen3-tiny")
    step = EngineStep(arch, CountingKernels(), dp=4, cuda_graph_max_batch=0)
    alone = [EngineStep(arch, CountingKernels(), cuda_graph_max_batch=0).batch_time_s(
        StepBatch(g.decode_seqs, g.decode_context_tokens, chunks=g.chunks)) for g in groups]
    assert step.batch_time_s(batch) == pytest.approx(max(alone))


@pytest.mark.parametrize("model, tp, dp, ep, dtype", [("deepseek-r1", 8, 1, 1, "fp8_block"),
                                                     ("deepseek-r1", 1, 8, 8, "fp8_block"),
                                                     ("qwen3-coder", 8, 1, 1, "bfloat16")])
def test_the_roofline_composed_per_kernel_prices_full_size_models(model, tp, dp, ep, dtype):
    arch = resolve_model(model)
    profile = load_profile("h200")
    step = EngineStep(arch, RooflineKernels(profile), tp=tp, dp=dp, ep=ep, weight_dtype=dtype)
    decode = StepBatch(decode_seqs=64, decode_context_tokens=64 * 2048)
    prefill = StepBatch(chunks=((8192, 0),))
    assert 0 < step.batch_time_s(decode) < step.batch_time_s(prefill) < 10
    # a kernel-by-kernel roofline is never cheaper than the block-by-block one it was split from
    # (each kernel pays the larger of its FLOPs and bytes on its own), less the overheads it leaves out
    blocks = StepCostModel(arch, profile, tp=tp, dp=dp, ep=ep, weight_dtype="fp8" if dtype == "fp8_block" else dtype)
    overheads = profile.step_overhead_ms * 1e-3 + arch.num_layers * profile.kernel_overhead_us_per_layer * 1e-6
    assert step.batch_time_s(prefill) >= blocks.batch_time_s(prefill) - overheads


def test_the_cost_model_prices_a_batch_as_its_totals():
    arch = resolve_model("qwen3-tiny")
    cost = StepCostModel(arch, load_profile("h200"))
    batch = StepBatch(decode_seqs=3, decode_context_tokens=30, tokens_per_decode_seq=2, chunks=((16, 4), (8, 0)))
    assert (batch.num_tokens, batch.num_sequences) == (6 + 24, 5)
    assert batch.context_pairs == 30 + (16 * 4 + 16 * 17 / 2) + (8 * 9 / 2)
    assert batch.kv_read_tokens == 30 + 20 + 8
    assert cost.batch_time_s(batch) == cost.step_time_s(30, 5, batch.context_pairs, batch.kv_read_tokens)


def test_the_overlap_scheduler_hides_the_scheduler_behind_the_kernels_it_outlasts_only():
    arch = resolve_model("qwen3-tiny")
    batch = StepBatch(decode_seqs=2, decode_context_tokens=20)
    kernels_s = EngineStep(arch, CountingKernels()).batch_time_s(batch)
    serial = EngineStep(arch, CountingKernels(), step_overhead_s=kernels_s / 2)
    assert serial.batch_time_s(batch) == pytest.approx(1.5 * kernels_s, rel=1e-12)
    hidden = EngineStep(arch, CountingKernels(), step_overhead_s=kernels_s / 2, overlap_scheduler=True)
    assert hidden.batch_time_s(batch) == pytest.approx(kernels_s, rel=1e-12)
    assert "step" not in hidden.breakdown(batch)
    longer = EngineStep(arch, CountingKernels(), step_overhead_s=3 * kernels_s, overlap_scheduler=True)
    assert longer.batch_time_s(batch) == pytest.approx(3 * kernels_s, rel=1e-12)
    assert longer.breakdown(batch)["step"] == pytest.approx(2 * kernels_s, rel=1e-12)
