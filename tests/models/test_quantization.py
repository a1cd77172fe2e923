"""The block-FP8 checkpoint facts: which tensors are FP8, their scales, the config that declares them."""

import pytest

from disaggsdk.errors import ModelError
from disaggsdk.models import resolve_model
from disaggsdk.models.quantization import BlockFP8, block_fp8_config, block_fp8_of, scale_name

R1_QUANTIZED = [
    "model.layers.0.self_attn.q_a_proj.weight",
    "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
    "model.layers.0.self_attn.kv_b_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.5.mlp.experts.255.gate_proj.weight",
    "model.layers.5.mlp.shared_experts.up_proj.weight",
    "model.layers.61.self_attn.q_b_proj.weight",  # the MTP layer's own attention
]
R1_KEPT = [
    "model.embed_tokens.weight",
    "lm_head.weight",
    "model.norm.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.self_attn.kv_a_layernorm.weight",
    "model.layers.5.mlp.gate.weight",  # the router
    "model.layers.61.eh_proj.weight",
    "model.layers.61.shared_head.head.weight",
    "model.layers.61.embed_tokens.weight",
]


@pytest.mark.parametrize("name", R1_QUANTIZED)
def test_linear_weights_of_the_layers_are_fp8(name):
    assert BlockFP8().is_quantized(name, (512, 7168))


@pytest.mark.parametrize("name", R1_KEPT)
def test_embeddings_norms_router_head_and_mtp_glue_stay_16_bit(name):
    assert not BlockFP8().is_quantized(name, (512, 7168))


def test_one_dimensional_tensors_and_scales_are_never_fp8():
    fmt = BlockFP8()
    assert not fmt.is_quantized("model.layers.5.mlp.gate.e_score_correction_bias", (256,))
    assert not fmt.is_quantized("model.layers.0.self_attn.o_proj.weight_scale_inv", (56, 128))


def test_modules_to_not_convert_keep_their_weights():
    fmt = BlockFP8(modules_to_not_convert=("model.layers.0.self_attn.o_proj",))
    assert not fmt.is_quantized("model.layers.0.self_attn.o_proj.weight", (64, 64))
    assert fmt.is_quantized("model.layers.1.self_attn.o_proj.weight", (64, 64))


def test_scale_shapes_round_ragged_blocks_up():
    assert BlockFP8().scale_shape((576, 7168)) == (5, 56)  # R1's kv_a_proj_with_mqa: 512 + 64 rows
    assert BlockFP8(32, 32).scale_shape((80, 256)) == (3, 8)
    assert scale_name("model.layers.0.mlp.down_proj.weight") == "model.layers.0.mlp.down_proj.weight_scale_inv"


def test_the_catalog_plans_r1_and_qwen_fp8_in_block_fp8_and_qwen_in_bf16():
    assert block_fp8_of(resolve_model("deepseek-r1").hf_config) == BlockFP8(128, 128)
    assert block_fp8_of(resolve_model("qwen3-coder-fp8").hf_config) == BlockFP8(128, 128)
    assert block_fp8_of(resolve_model("qwen3-coder").hf_config) is None
    assert block_fp8_of({"quantization_config": block_fp8_config(64)}) == BlockFP8(64, 64)


@pytest.mark.parametrize(("quant", "message"), [
    ({"quant_method": "awq"}, "quant_method is 'awq'"),
    ({"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": [128, 128]}, "fmt is 'e5m2'"),
    ({"quant_method": "fp8"}, "weight_block_size is None"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size is \\[128\\]"),
])
def test_formats_the_engine_cannot_load_are_refused_by_name(quant, message):
    with pytest.raises(ModelError, match=message):
        block_fp8_of({"quantization_config": quant}, "ckpt")
