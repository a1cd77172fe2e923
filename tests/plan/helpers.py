"""Shared builders for planner tests: specs and tiny architectures made directly, no YAML."""

from __future__ import annotations

from disaggsdk.models import ModelArch
from disaggsdk.spec.kv import KV
from disaggsdk.spec.topology import Hardware, Role
from disaggsdk.spec.types import Spec


def tiny_arch(
    attention: str, num_kv_heads: int, head_dim: int, num_layers: int, latent: int = 6
) -> ModelArch:
    """A made-up architecture with just the numbers the planner reads."""
    mla = attention == "mla"
    return ModelArch(
        name=f"test-{attention}",
        family="deepseek_v3" if mla else "qwen3",
        attention=attention,
        num_layers=num_layers,
        hidden_size=64,
        vocab_size=64,
        num_attention_heads=16 * max(1, num_kv_heads),
        num_kv_heads=1 if mla else num_kv_heads,
        head_dim=head_dim,
        intermediate_size=64,
        kv_lora_rank=latent - 2 if mla else 0,
        qk_rope_head_dim=2 if mla else 0,
    )


def make_spec(
    p_tp: int = 1,
    d_tp: int = 1,
    *,
    model: str = "qwen3-coder",
    p_dp: int = 1,
    d_dp: int = 1,
    p_replicas: int = 1,
    d_replicas: int = 1,
    layout: str = "HND",
    page_size: int = 16,
    dtype: str = "bfloat16",
    gpus_per_node: int = 8,
    nics_per_node: int = 8,
    seed: int = 0,
) -> Spec:
    """A spec with the roles and KV format given."""
    return Spec(
        model=model,
        seed=seed,
        hardware=Hardware(gpus_per_node=gpus_per_node, nics_per_node=nics_per_node),
        prefill=Role(replicas=p_replicas, tp=p_tp, dp=p_dp),
        decode=Role(replicas=d_replicas, tp=d_tp, dp=d_dp),
        kv=KV(layout=layout, page_size=page_size, dtype=dtype),
    )
