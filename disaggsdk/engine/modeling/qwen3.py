"""Qwen3 (dense): GQA with per-head q/k RMSNorm, half-split rope, SwiGLU MLP.

Tensor parallelism: query heads split evenly; KV heads per `TensorParallel.kv_head_range`
(replicated once tp exceeds them); q|k|v stacked in one column-parallel weight; o_proj and
down_proj row parallel, each followed by one all-reduce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from disaggsdk.engine.modeling.layers.decoder import DecoderLayer, DecoderModel
from disaggsdk.engine.modeling.layers.linear import ColumnParallelLinear, OutputPart, RowParallelLinear
from disaggsdk.engine.modeling.layers.mlp import GatedMLP
from disaggsdk.engine.modeling.layers.norm import RMSNorm
from disaggsdk.engine.modeling.layers.rope import RotaryEmbedding, rope_parameters
from disaggsdk.engine.parallel import TensorParallel

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import LayerAttention
    from disaggsdk.models.arch import ModelArch


class Qwen3Attention(nn.Module):
    """GQA self-attention of one layer; returns this rank's partial o_proj output."""

    def __init__(self, prefix: str, arch: ModelArch, tp: TensorParallel, dtype: torch.dtype,
                 rotary: RotaryEmbedding):
        super().__init__()
        hd = arch.head_dim
        q_start, q_stop = tp.shard(arch.num_attention_heads)
        kv_start, kv_stop = tp.kv_head_range(arch.num_kv_heads)
        self.num_heads = q_stop - q_start
        self.num_kv_heads = kv_stop - kv_start
        self.head_dim = hd
        self.scale = hd**-0.5
        self.qkv_proj = ColumnParallelLinear(
            arch.hidden_size,
            [
                OutputPart(f"{prefix}q_proj.weight", arch.num_attention_heads * hd, (q_start * hd, q_stop * hd)),
                OutputPart(f"{prefix}k_proj.weight", arch.num_kv_heads * hd, (kv_start * hd, kv_stop * hd)),
                OutputPart(f"{prefix}v_proj.weight", arch.num_kv_heads * hd, (kv_start * hd, kv_stop * hd)),
            ],
            dtype,
        )
        eps = float(arch.hf_config.get("rms_norm_eps", 1e-6))
        self.q_norm = RMSNorm(f"{prefix}q_norm.weight", hd, eps, dtype)
        self.k_norm = RMSNorm(f"{prefix}k_norm.weight", hd, eps, dtype)
        self.o_proj = RowParallelLinear(
            f"{prefix}o_proj.weight", arch.num_attention_heads * hd, (q_start * hd, q_stop * hd),
            arch.hidden_size, dtype,
        )
        self.rotary = rotary  # the model's (shared by all layers)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: LayerAttention,
                layer_id: int) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.qkv_proj.split_sizes, dim=-1)
        q = self.q_norm(q.view(n, self.num_heads, self.head_dim))
        k = self.k_norm(k.view(n, self.num_kv_heads, self.head_dim))
        v = v.view(n, self.num_kv_heads, self.head_dim)
        q = self.rotary.rotate(q, cos, sin)
        k = self.rotary.rotate(k, cos, sin)
        out = attn.run(layer_id, q, k, v, self.scale)  # [n, num_heads, head_dim]
        return self.o_proj(out.reshape(n, self.num_heads * self.head_dim))


class Qwen3ForCausalLM(DecoderModel):
    """Qwen3 dense; `Qwen3MoeForCausalLM` reuses it with a different MLP per layer."""

    def __init__(self, arch: ModelArch, tp: TensorParallel, dtype: torch.dtype):
        super().__init__(arch, tp, dtype)
        config = arch.hf_config
        self.rotary = RotaryEmbedding(
            arch.head_dim, rope_parameters(config), int(config.get("max_position_embeddings", 4096))
        )
        for i in range(arch.num_layers):
            prefix = f"model.layers.{i}."
            attn = Qwen3Attention(f"{prefix}self_attn.", arch, tp, dtype, self.rotary)
            self.layers.append(
                DecoderLayer(prefix, i, attn, self.make_mlp(i, f"{prefix}mlp."), arch.hidden_size, self.eps, tp, dtype)
            )

    def make_mlp(self, layer_id: int, prefix: str) -> nn.Module:
        """The MLP of one layer (dense here)."""
        return GatedMLP(prefix, self.arch.hidden_size, self.arch.intermediate_size, self.tp, self.dtype)
