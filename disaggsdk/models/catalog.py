"""The model catalog: real architectures we plan for, and tiny variants that run on a CPU.

Each entry is a Hugging Face ``config.json`` dict, so the engine builds a tiny model and
`transformers` builds its reference twin from the very same numbers. Real numbers come from the
models' published config.json (see docs/machine-facts.md).
"""

from __future__ import annotations

import copy
from typing import Any

# Tiny models: sized so that on a 2-core CPU a 1,024-token prefill takes tens of milliseconds
# and a decode step a few, so prefill/decode interference is visible yet tests stay fast.
# Query heads are divisible by 8 so the 8-GPU topologies run unchanged with `--tiny`. Each ships
# trained (`disaggsdk.models.shipped`): a 4,096-entry byte-level BPE vocabulary (a multiple of every
# tp size the tests use) whose ids 0.. are <|endoftext|> (pad), <|im_start|>, <|im_end|> (eos) and
# the tool-call markers; the checkpoints' generation_config.json adds <|endoftext|> as a stop id.
_TINY_COMMON: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": None,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float32",
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "attention_bias": False,
    "attention_dropout": 0.0,
}

_QWEN3_CODER: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "hidden_size": 6144,
    "intermediate_size": 8192,
    "moe_intermediate_size": 2560,
    "num_hidden_layers": 62,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "num_experts": 160,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 262144,
    "rope_theta": 10000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

# the quantization_config of the block-FP8 checkpoints below (128x128 weight blocks), one dict for all:
# `catalog_config` hands out deep copies, so no caller edits it
_BLOCK_FP8: dict[str, Any] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                              "weight_block_size": [128, 128]}

# Qwen3-32B, dense GQA: Qwen/Qwen3-32B's config.json (bfloat16). Qwen publishes it as "-FP8" too
# (Qwen/Qwen3-32B-FP8: block FP8 128x128, the same config plus its quantization_config), the checkpoint
# NVIDIA's Dynamo tuning guide serves (docs/published.md).
_QWEN3_32B: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 151936,
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "hidden_act": "silu",
    "attention_bias": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}

# Catalog names are the formats the models ship in: Qwen publishes Qwen3-Coder-480B-A35B-Instruct in
# bfloat16 and as "-FP8" (block FP8, the same format as DeepSeek's), Qwen3-32B likewise; DeepSeek publishes R1
# in FP8 only (DeepSeek-V3 has the same architecture: its config.json differs from R1's only in
# transformers_version).
CATALOG: dict[str, dict[str, Any]] = {
    "qwen3-coder": _QWEN3_CODER,
    "qwen3-coder-fp8": {
        **_QWEN3_CODER,
        "quantization_config": _BLOCK_FP8,
    },
    "qwen3-32b": _QWEN3_32B,
    "qwen3-32b-fp8": {
        **_QWEN3_32B,
        "quantization_config": _BLOCK_FP8,
    },
    "deepseek-r1": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 3,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "num_nextn_predict_layers": 1,
        "max_position_embeddings": 163840,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 1,
        # DeepSeek ships R1 only in block FP8 (its norms, embeddings, router and head in bfloat16)
        "quantization_config": _BLOCK_FP8,
    },
    "qwen3-tiny": {
        **_TINY_COMMON,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "intermediate_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 32,
    },
    "qwen3-coder-tiny": {
        **_TINY_COMMON,
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
    },
    "deepseek-r1-tiny": {
        **_TINY_COMMON,
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "n_group": 4,
        "topk_group": 2,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "num_nextn_predict_layers": 1,
        "rope_scaling": None,
    },
}

# A real model's CPU stand-in with the same attention kind (used by `launch --tiny`).
TINY_VARIANT = {
    "qwen3-coder": "qwen3-coder-tiny",
    "qwen3-coder-fp8": "qwen3-coder-tiny",
    "deepseek-r1": "deepseek-r1-tiny",
    "qwen3-32b": "qwen3-tiny",
    "qwen3-32b-fp8": "qwen3-tiny",
}


def catalog_names() -> list[str]:
    """Names a spec's `model` may use besides a checkpoint directory."""
    return sorted(CATALOG)


def catalog_config(name: str) -> dict[str, Any]:
    """A deep copy of the catalog entry's config.json dict (callers may edit it)."""
    return copy.deepcopy(CATALOG[name])


def is_tiny(name: str) -> bool:
    """True for catalog models meant to run on a CPU."""
    return name.endswith("-tiny")
