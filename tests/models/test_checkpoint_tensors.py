"""The checkpoint inventory against reality: the engine's own weight slots, and R1's published size."""

import pytest

from disaggsdk.models import resolve_model
from disaggsdk.models.checkpoint_tensors import checkpoint_tensors, is_moe_layer, weight_totals


@pytest.mark.parametrize("model", ["qwen3-tiny", "qwen3-coder-tiny", "deepseek-r1-tiny"])
@pytest.mark.parametrize("tp", [1, 2])
def test_inventory_equals_the_engines_weight_slots(model, tp):
    torch = pytest.importorskip("torch")
    from disaggsdk.engine.modeling import model_class
    from disaggsdk.engine.parallel import TensorParallel

    arch = resolve_model(model)
    inventory = [t for t in checkpoint_tensors(arch) if t.scale_of is None]
    for rank in range(tp):
        with torch.device("meta"):
            net = model_class(arch.family)(arch, TensorParallel(rank, tp), torch.float32)
        slots = {s.name: s for s in net.weight_slots()}
        assert sorted(slots) == sorted(t.name for t in inventory)
        for t in inventory:
            slot = slots[t.name]
            assert slot.full_shape == t.shape, t.name
            # the engine keeps embeddings and lm_head whole on every rank (vocab_parallel=False)
            assert slot.local_shape() == t.local_shape(tp, rank, arch.num_kv_heads), t.name


def test_vocab_parallel_splits_embeddings_as_vllm_does():
    arch = resolve_model("deepseek-r1")
    embed = next(t for t in checkpoint_tensors(arch) if t.name == "model.embed_tokens.weight")
    assert embed.local_shape(8, 3) == (129280, 7168)
    assert embed.local_shape(8, 3, vocab_parallel=True) == (16160, 7168)


def test_gqa_kv_heads_replicate_beyond_tp():
    arch = resolve_model("qwen3-coder")  # 8 KV heads of 128
    k = next(t for t in checkpoint_tensors(arch) if t.name == "model.layers.0.self_attn.k_proj.weight")
    assert k.local_shape(4, 0, arch.num_kv_heads) == (2 * 128, 6144)
    assert k.local_shape(16, 5, arch.num_kv_heads) == (128, 6144)


def test_r1_is_671b_plus_a_14b_mtp_layer_and_688_gb_in_fp8():
    """DeepSeek's README: 671B parameters of the main model, 14B of the MTP module, 685B in all; the FP8
    checkpoint on Hugging Face is ~688.6 GB (163 safetensors shards)."""
    arch = resolve_model("deepseek-r1")
    totals = weight_totals(arch)
    assert totals.num_params["model"] == pytest.approx(671.0e9, rel=0.002)
    # 13.5B counted: the MTP layer (11.8B in its 256 experts) and its copies of the embedding and head
    assert totals.num_params["mtp"] == pytest.approx(14e9, rel=0.05)
    assert totals.total_bytes == pytest.approx(688.6e9, rel=0.001)


def test_r1_stores_fp8_weights_with_float32_block_scales_and_mtp_as_its_own_group():
    tensors = {t.name: t for t in checkpoint_tensors(resolve_model("deepseek-r1"))}
    w = tensors["model.layers.5.mlp.experts.7.down_proj.weight"]
    assert (w.dtype, w.shape, w.expert, w.part) == ("float8_e4m3fn", (7168, 2048), 7, "routed_experts")
    s = tensors["model.layers.5.mlp.experts.7.down_proj.weight_scale_inv"]
    assert (s.dtype, s.shape, s.scale_of) == ("float32", (56, 16), w.name)
    assert tensors["model.embed_tokens.weight"].dtype == "bfloat16"
    assert tensors["model.layers.5.mlp.gate.e_score_correction_bias"].dtype == "float32"
    mtp = {n for n, t in tensors.items() if t.group == "mtp"}
    assert {"model.layers.61.eh_proj.weight", "model.layers.61.enorm.weight", "model.layers.61.hnorm.weight",
            "model.layers.61.shared_head.norm.weight", "model.layers.61.shared_head.head.weight",
            "model.layers.61.embed_tokens.weight", "model.layers.61.self_attn.kv_b_proj.weight",
            "model.layers.61.mlp.experts.255.up_proj.weight"} <= mtp
    assert all(n.startswith("model.layers.61.") for n in mtp)


def test_bf16_qwen3_coder_has_no_scales_and_its_fp8_release_does():
    bf16 = checkpoint_tensors(resolve_model("qwen3-coder"))
    fp8 = checkpoint_tensors(resolve_model("qwen3-coder-fp8"))
    assert {t.dtype for t in bf16} == {"bfloat16"}
    assert sum(t.scale_of is not None for t in fp8) == sum(t.dtype == "float8_e4m3fn" for t in fp8) > 0
    assert weight_totals(resolve_model("qwen3-coder")).num_params["model"] == pytest.approx(480e9, rel=0.001)


def test_moe_layers_follow_the_config():
    r1 = resolve_model("deepseek-r1")
    assert [is_moe_layer(r1, i) for i in range(5)] == [False, False, False, True, True]
    assert not is_moe_layer(resolve_model("qwen3-tiny"), 0)
