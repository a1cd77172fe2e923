"""Tiny random Hugging Face models of the catalog's families: the reference the engine is checked against.

The one builder of transformers models and checkpoint directories for every test, so the model
tests (logits against transformers) and the parity tests (greedy tokens against `generate`) check
the engine against the same kind of model.
"""

from __future__ import annotations

from pathlib import Path

HF_CONFIG = {"qwen3-tiny": "Qwen3Config", "qwen3-coder-tiny": "Qwen3MoeConfig", "deepseek-r1-tiny": "DeepseekV3Config"}
WEIGHT_STD = 0.08  # transformers draws 0.02: near-uniform logits, where greedy choices are coin flips


def hf_model(name: str, seed: int = 0, **overrides):
    """A tiny random transformers model of a catalog family (float32, seeded, eval mode).

    Weights are drawn wider than transformers' init so greedy choices are clear rather than
    near-uniform; what transformers initialises to constants (norm weights, DeepSeek's
    expert-score bias) is perturbed so a test notices a swapped norm or an ignored bias. Byte-level
    special ids (bos 256, eos 257, pad 258), so the engine reads text through `ByteTokenizer`; no
    EOS in its generation config, so generation runs to max_new_tokens.

    Args:
        name: a tiny catalog model, a key of `HF_CONFIG`.
        seed: torch seed the weights are drawn with.
        **overrides: config fields that replace the catalog's (``num_key_value_heads=1``).

    Returns:
        The transformers model.
    """
    import torch
    import transformers

    from disaggsdk.models import catalog_config

    # the byte-level special ids: a directory without tokenizer.json then gets `ByteTokenizer`
    byte_level = {"bos_token_id": 256, "eos_token_id": 257, "pad_token_id": 258}
    config = getattr(transformers, HF_CONFIG[name])(**{**catalog_config(name), **byte_level, **overrides})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, WEIGHT_STD)
            elif pname.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
        for pname, buf in model.named_buffers():
            if pname.endswith("e_score_correction_bias"):
                buf.copy_(torch.rand_like(buf) * 0.1)
    model.generation_config.eos_token_id = None
    return model


def save_hf_checkpoint(name: str, directory: str | Path, seed: int = 0, *, max_shard_size: str | None = None,
                       **overrides):
    """`hf_model` saved as a checkpoint directory the engine loads (config.json, generation_config.json,
    model.safetensors, or shards and their index).

    Args:
        name, seed, overrides: as for `hf_model`.
        directory: created if missing.
        max_shard_size: shard the weights into files of at most this size ("300KB"); None: one file.

    Returns:
        The transformers model that was saved.
    """
    model = hf_model(name, seed, **overrides)
    shards = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **shards)
    return model
