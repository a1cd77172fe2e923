"""Tiny random Hugging Face models of the catalog's families: the reference the engine is checked against."""

from __future__ import annotations

HF_CONFIG = {"qwen3-tiny": "Qwen3Config", "qwen3-coder-tiny": "Qwen3MoeConfig", "deepseek-r1-tiny": "DeepseekV3Config"}


def hf_model(name: str):
    """A tiny random transformers model of a catalog family (float32, seeded).

    Weights are drawn wider than transformers' 0.02 init (and norms and DeepSeek's expert-score
    bias perturbed) so greedy choices are clear rather than near-uniform; no EOS, so generation
    runs to max_new_tokens.
    """
    import torch
    import transformers

    from disaggsdk.models import catalog_config

    config = getattr(transformers, HF_CONFIG[name])(**catalog_config(name))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
            elif pname.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
        for pname, buf in model.named_buffers():
            if pname.endswith("e_score_correction_bias"):
                buf.copy_(torch.rand_like(buf) * 0.1)
    model.generation_config.eos_token_id = None
    return model
