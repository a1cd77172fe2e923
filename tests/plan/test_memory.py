"""The memory plan's rules (disaggsdk/plan/memory.py): parts, ep, MTP, FP8 on GPU and CPU, the CPU budget."""

from __future__ import annotations

import attrs
import pytest

from disaggsdk.errors import SpecError
from disaggsdk.models import resolve_model
from disaggsdk.plan import make_plan
from disaggsdk.plan.memory import (
    GPU_FIXED_OVERHEAD_BYTES,
    expert_range,
    num_pages_per_rank,
    rank_weight_bytes,
    workspace_bytes,
)
from disaggsdk.spec import load_spec, spec_from_dict
from disaggsdk.spec.topology import GPU_MEMORY_GB

R1 = resolve_model("deepseek-r1")


def test_expert_parallel_ranks_hold_contiguous_ranges_the_first_ones_one_more():
    assert [expert_range(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [expert_range(256, 8, r) for r in (0, 7)] == [(0, 32), (224, 256)]


def test_ep_counts_only_the_experts_a_rank_holds():
    sliced = rank_weight_bytes(R1, 8)
    whole = rank_weight_bytes(R1, 8, experts_held=32)
    assert sliced.routed_experts == whole.routed_experts  # 1/8 of each expert or 32 whole ones: the same bytes
    assert rank_weight_bytes(R1, 1, experts_held=32).routed_experts == sliced.routed_experts
    assert rank_weight_bytes(R1, 1).routed_experts == 8 * sliced.routed_experts


def test_the_mtp_layer_counts_only_when_drafting_with_it():
    plain = rank_weight_bytes(R1, 8)
    mtp = rank_weight_bytes(R1, 8, include_mtp=True)
    # 256 experts / 8 (1.41 GB), eh_proj replicated in bf16 (0.21 GB), attention, router, shared expert, norms
    assert plain.mtp == 0 and 1.6e9 < mtp.mtp < 1.7e9
    assert mtp.total - plain.total == mtp.mtp + (mtp.fp8_scales - plain.fp8_scales)
    spec = load_spec("specs/r1_tp.yaml")
    drafting = attrs.evolve(spec, speculative=attrs.evolve(spec.speculative, method="mtp"))
    a, b = make_plan(spec).memory[0].ranks[0], make_plan(drafting).memory[0].ranks[0]
    assert b.weights.mtp > 0 and b.kv_bytes_per_token == a.kv_bytes_per_token * 62 // 61


def test_fp8_stays_fp8_on_a_gpu_and_is_dequantized_on_a_cpu():
    fp8, bf16 = resolve_model("qwen3-coder-fp8"), resolve_model("qwen3-coder")
    gpu = rank_weight_bytes(fp8, 8)
    cpu = rank_weight_bytes(fp8, 8, keep_fp8=False, vocab_parallel=False)
    assert gpu.fp8_scales > 0 and cpu.fp8_scales == 0
    assert gpu.routed_experts * 2 == cpu.routed_experts == rank_weight_bytes(bf16, 8).routed_experts
    assert cpu.embeddings == 8 * gpu.embeddings - 7 * 6144 * 2  # whole on a CPU rank (the final norm is not split)


def test_fp8_kv_holds_twice_the_tokens():
    spec = spec_from_dict({"model": "qwen3-coder-fp8", "prefill": {"tp": 8}, "decode": {"tp": 8},
                           "engine": {"dtype": "bfloat16"}})
    fp8 = attrs.evolve(spec, kv=attrs.evolve(spec.kv, dtype="fp8"))
    a, b = make_plan(spec).memory[1].ranks[0], make_plan(fp8).memory[1].ranks[0]
    assert b.kv_bytes_per_token * 2 == a.kv_bytes_per_token and b.num_pages == 2 * a.num_pages


def test_the_cpu_budget_gives_tiny_specs_about_the_pages_they_had():
    for name in ("tiny_local", "tiny_pd", "tiny_r1_mtp"):
        plan = make_plan(load_spec(f"specs/{name}.yaml"))
        assert plan.memory_problems == [], name
        pages = plan.memory[0].ranks[0].num_pages
        assert 1024 <= pages <= 1.5 * 2048, (name, pages)
    local = make_plan(load_spec("specs/tiny_local.yaml")).memory[0].ranks[0]
    assert not local.num_pages_explicit and 1024 <= local.num_pages <= 1536
    assert local.workspace_bytes < GPU_FIXED_OVERHEAD_BYTES  # no fixed GPU overhead on a CPU
    assert local.device_bytes == 0.25e9


def test_gpu_memory_is_the_hardware_profiles():
    from disaggsdk.sim.hardware import load_profile

    assert GPU_MEMORY_GB == {kind: load_profile(kind).memory_gb for kind in ("h100", "h200")}


def test_workspace_grows_with_the_step_budget_and_holds_the_gpu_overhead():
    small = workspace_bytes(R1, 8, 1, 2048, 64, "bfloat16", on_gpu=True)
    large = workspace_bytes(R1, 8, 1, 8192, 64, "bfloat16", on_gpu=True)
    assert small > GPU_FIXED_OVERHEAD_BYTES and large > small
    assert workspace_bytes(R1, 8, 1, 2048, 64, "bfloat16", on_gpu=False) == small - GPU_FIXED_OVERHEAD_BYTES


def test_num_pages_is_the_plans_unless_set_and_refuses_no_room():
    spec = load_spec("specs/r1_tp.yaml")
    assert num_pages_per_rank(spec, "decode") == make_plan(spec).memory[1].ranks[0].num_pages == 8566
    assert num_pages_per_rank(attrs.evolve(spec, engine=attrs.evolve(spec.engine, num_pages=100)), "decode") == 100
    h100 = attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpu="h100"))
    with pytest.raises(SpecError, match=r"\$\.decode: decode rank 0 needs 85.1 GB"):
        num_pages_per_rank(h100, "decode")


def test_the_fluent_builder_sets_ep():
    from disaggsdk import Cluster

    c = Cluster().model("deepseek-r1").prefill(tp=8).decode(tp=1, dp=8, ep=8).engine(dtype="bfloat16")
    assert c.spec.decode.ep == 8 and c.spec.prefill.ep == 1
    assert make_plan(c.spec).memory_problems == []
    assert c.decoders(2, tp=1, dp=8, ep=8).draft.decode.replicas == 2
