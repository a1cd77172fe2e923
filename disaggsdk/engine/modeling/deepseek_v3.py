"""DeepSeek-V3 / R1: multi-head latent attention (MLA), MoE with shared experts and group-limited
routing after ``first_k_dense_replace`` dense layers, and the MTP layer's weights.

MLA runs in the absorbed form the KV cache needs: the cache keeps, per token, the normalised
compressed KV (``kv_lora_rank``) and the rope key (``qk_rope_head_dim``). ``kv_b_proj`` splits per
head into W_UK [qk_nope, kv_lora] and W_UV [v_head, kv_lora]; the query's nope part is taken
through W_UK into the latent space, and the attention output (a mix of latents) comes back
through W_UV. Tensor parallelism: heads split, the latent replicated.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from disaggsdk.engine.modeling.layers import amx_linear, skinny
from disaggsdk.engine.modeling.layers.decoder import DecoderLayer, DecoderModel, Embedding
from disaggsdk.engine.modeling.layers.linear import ColumnParallelLinear, OutputPart, RowParallelLinear, replicated_linear
from disaggsdk.engine.modeling.layers.mlp import GatedMLP
from disaggsdk.engine.modeling.layers.moe import Experts, GroupLimitedRouter
from disaggsdk.engine.modeling.layers.norm import RMSNorm
from disaggsdk.engine.modeling.layers.rope import RotaryEmbedding, rope_parameters, softmax_scale_factor
from disaggsdk.engine.parallel import TensorParallel

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import LayerAttention
    from disaggsdk.models.arch import ModelArch

MTP = "mtp"  # optional weight group: transformers' save_pretrained drops the MTP layer


class MLAttention(nn.Module):
    """MLA of one layer; returns this rank's partial o_proj output."""

    def __init__(self, prefix: str, arch: ModelArch, tp: TensorParallel, dtype: torch.dtype,
                 rotary: RotaryEmbedding, sm_scale: float, group: str | None = None):
        super().__init__()
        config = arch.hf_config
        h0, h1 = tp.shard(arch.num_attention_heads)
        self.num_heads = h1 - h0
        self.nope, self.rope, self.v_dim = arch.qk_nope_head_dim, arch.qk_rope_head_dim, arch.v_head_dim
        self.kv_lora_rank = arch.kv_lora_rank
        qk = self.nope + self.rope
        eps = float(config.get("rms_norm_eps", 1e-6))
        hidden = arch.hidden_size
        # the query's low-rank down projection and its norm; None where the model projects directly
        self.q_a_proj: ColumnParallelLinear | None = None
        self.q_a_layernorm: RMSNorm | None = None
        if arch.q_lora_rank:
            self.q_a_proj = replicated_linear(f"{prefix}q_a_proj.weight", hidden, arch.q_lora_rank, dtype, group)
            self.q_a_layernorm = RMSNorm(f"{prefix}q_a_layernorm.weight", arch.q_lora_rank, eps, dtype, group)
            q_in, q_name = arch.q_lora_rank, f"{prefix}q_b_proj.weight"
        else:
            q_in, q_name = hidden, f"{prefix}q_proj.weight"
        self.q_proj = ColumnParallelLinear(
            q_in, [OutputPart(q_name, arch.num_attention_heads * qk, (h0 * qk, h1 * qk))], dtype, group
        )
        self.kv_a_proj_with_mqa = replicated_linear(
            f"{prefix}kv_a_proj_with_mqa.weight", hidden, self.kv_lora_rank + self.rope, dtype, group
        )
        self.kv_a_layernorm = RMSNorm(f"{prefix}kv_a_layernorm.weight", self.kv_lora_rank, eps, dtype, group)
        kv_b = self.nope + self.v_dim
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank,
            [OutputPart(f"{prefix}kv_b_proj.weight", arch.num_attention_heads * kv_b, (h0 * kv_b, h1 * kv_b))],
            dtype, group,
        )
        self.o_proj = RowParallelLinear(
            f"{prefix}o_proj.weight", arch.num_attention_heads * self.v_dim, (h0 * self.v_dim, h1 * self.v_dim),
            hidden, dtype, group,
        )
        self.rotary = rotary
        self.sm_scale = sm_scale

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attn: LayerAttention,
                layer_id: int) -> torch.Tensor:
        n, heads = x.shape[0], self.num_heads
        q_in = x if self.q_a_proj is None or self.q_a_layernorm is None else self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_proj(q_in).view(n, heads, self.nope + self.rope)
        q_nope, q_rope = q.split([self.nope, self.rope], dim=-1)
        compressed = self.kv_a_proj_with_mqa(x)
        kv_latent = self.kv_a_layernorm(compressed[:, : self.kv_lora_rank])  # [n, kv_lora_rank]
        k_rope = compressed[:, None, self.kv_lora_rank :]  # [n, 1, qk_rope_head_dim]
        q_rope = self.rotary.rotate(q_rope, cos, sin)
        k_rope = self.rotary.rotate(k_rope, cos, sin)[:, 0]
        w_kv = self.kv_b_proj.weight.view(heads, self.nope + self.v_dim, self.kv_lora_rank)
        w_uk, w_uv = w_kv[:, : self.nope], w_kv[:, self.nope :]  # [heads, nope|v, kv_lora_rank]
        # q_latent[t, h] = q_nope[t, h] @ W_UK[h]: scores against the latent equal scores against k_nope
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [n, heads, kv_lora_rank]
        out_latent = attn.run_mla(layer_id, q_latent, q_rope, kv_latent, k_rope, self.sm_scale)
        out = torch.bmm(out_latent.transpose(0, 1), w_uv.transpose(1, 2))  # [heads, n, v_head_dim]
        return self.o_proj(out.transpose(0, 1).reshape(n, heads * self.v_dim))


class DeepseekV3MoE(nn.Module):
    """Routed experts plus shared experts; returns this rank's partial sum."""

    def __init__(self, prefix: str, arch: ModelArch, tp: TensorParallel, dtype: torch.dtype,
                 group: str | None = None):
        super().__init__()
        self.gate = GroupLimitedRouter(f"{prefix}gate.", arch.hf_config, arch.hidden_size, group)
        self.experts = Experts(f"{prefix}experts.", arch.num_experts, arch.hidden_size, arch.moe_intermediate_size,
                               tp, dtype, group)
        self.shared_experts = (
            GatedMLP(f"{prefix}shared_experts.", arch.hidden_size,
                     arch.moe_intermediate_size * arch.num_shared_experts, tp, dtype, group)
            if arch.num_shared_experts else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, ids, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out


class MTPLayer(nn.Module):
    """The multi-token-prediction layer (checkpoint layer ``num_hidden_layers + i``), for
    speculative decoding: h' = eh_proj([enorm(embed(next token)) | hnorm(h)]) through one decoder
    layer, then shared_head.norm and shared_head.head give the draft logits. Not run by the
    model's ``forward``; its attention uses KV layer ``num_layers + i`` of the same pages.
    It is the model's `DraftLayer`."""

    packed_head: torch.Tensor | None  # a buffer: amx_linear.pack(head), or None

    def __init__(self, index: int, arch: ModelArch, tp: TensorParallel, dtype: torch.dtype,
                 rotary: RotaryEmbedding, sm_scale: float, eps: float):
        super().__init__()
        layer_id = arch.num_layers + index
        p = f"model.layers.{layer_id}."
        hidden = arch.hidden_size
        self.embed_tokens = Embedding(f"{p}embed_tokens.weight", arch.vocab_size, hidden, dtype, MTP)
        self.enorm = RMSNorm(f"{p}enorm.weight", hidden, eps, dtype, MTP)
        self.hnorm = RMSNorm(f"{p}hnorm.weight", hidden, eps, dtype, MTP)
        self.eh_proj = replicated_linear(f"{p}eh_proj.weight", 2 * hidden, hidden, dtype, MTP)
        self.block = DecoderLayer(
            p, layer_id, MLAttention(f"{p}self_attn.", arch, tp, dtype, rotary, sm_scale, MTP),
            DeepseekV3MoE(f"{p}mlp.", arch, tp, dtype, MTP), hidden, eps, tp, dtype, MTP,
        )
        self.shared_head_norm = RMSNorm(f"{p}shared_head.norm.weight", hidden, eps, dtype, MTP)
        self.shared_head = Embedding(f"{p}shared_head.head.weight", arch.vocab_size, hidden, dtype, MTP)
        self._rotary = [rotary]  # the target's (a list: not a second owner of its buffers)
        self.register_buffer("packed_head", None, persistent=False)  # amx_linear.pack(head), or None

    def forward(self, hidden_prev: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                attn: LayerAttention, on_layer_done: Callable[[int, torch.Tensor], None] | None = None,
                ) -> torch.Tensor:
        """The layer's hidden states (before ``shared_head.norm``), [n, hidden].

        Args:
            hidden_prev: h_i for each row: the target's final (normed) hidden state, or when
                drafting a chain, this layer's own output at the previous position.
            next_ids: t_{i+1} for each row (the token after the one h_i was computed for).
            positions: i for each row; the batch ``attn`` is planned for puts row i's KV at i.
            on_layer_done: called as the target's layers call it, with this layer's KV index.
        """
        x = self.eh_proj(torch.cat([self.enorm(self.embed_tokens(next_ids)), self.hnorm(hidden_prev)], dim=-1))
        cos, sin = self._rotary[0].cos_sin(positions, x.dtype)
        return self.block(x, cos, sin, on_layer_done, attn)

    def share_with(self, model: DecoderModel) -> int:
        """Use the target's embedding and head where this layer's are copies of them (DeepSeek
        ships them so): one tensor in memory and in the caches, not two. Returns how many."""
        shared = 0
        for mine, theirs in ((self.embed_tokens, model.embed_tokens), (self.shared_head, model.lm_head)):
            if theirs is not None and mine.weight is not theirs.weight and torch.equal(mine.weight, theirs.weight):
                mine.weight = theirs.weight
                shared += 1
        return shared

    def draft(self, hidden_prev: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
              attn: LayerAttention, rows: torch.Tensor,
              on_layer_done: Callable[[int, torch.Tensor], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` over every row, then the output of ``rows`` and its greedy draft (int64
        [len(rows)]): what speculative decoding keeps of a step."""
        kept = self(hidden_prev, next_ids, positions, attn, on_layer_done)[rows]
        return kept, self.compute_logits(kept).argmax(dim=-1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits [n, vocab] (float32) of the layer's hidden states: t_{i+2} for row i."""
        return skinny.linear(self.shared_head_norm(hidden), self.shared_head.weight, self.packed_head).float()

    def pack_for_decode(self) -> int:
        """Keep the head in the AMX kernel's layout too, where that kernel runs (amx_linear).
        Returns how many tensors were packed (0 or 1)."""
        self.packed_head = amx_linear.pack_if_useful(self.shared_head.weight)
        return int(self.packed_head is not None)


class DeepseekV3ForCausalLM(DecoderModel):
    def __init__(self, arch: ModelArch, tp: TensorParallel, dtype: torch.dtype):
        super().__init__(arch, tp, dtype)
        config = arch.hf_config
        params = rope_parameters(config)
        self.rotary = RotaryEmbedding(
            arch.qk_rope_head_dim, params, int(config.get("max_position_embeddings", 4096)),
            interleaved=bool(config.get("rope_interleave", True)),
        )
        sm_scale = (arch.qk_nope_head_dim + arch.qk_rope_head_dim) ** -0.5 * softmax_scale_factor(params)
        for i in range(arch.num_layers):
            prefix = f"model.layers.{i}."
            if i >= arch.first_k_dense and arch.num_experts:
                mlp: nn.Module = DeepseekV3MoE(f"{prefix}mlp.", arch, tp, dtype)
            else:
                mlp = GatedMLP(f"{prefix}mlp.", arch.hidden_size, arch.intermediate_size, tp, dtype)
            attn = MLAttention(f"{prefix}self_attn.", arch, tp, dtype, self.rotary, sm_scale)
            self.layers.append(DecoderLayer(prefix, i, attn, mlp, arch.hidden_size, self.eps, tp, dtype))
        self.mtp: nn.ModuleList | None = nn.ModuleList(
            MTPLayer(i, arch, tp, dtype, self.rotary, sm_scale, self.eps) for i in range(arch.num_mtp_layers)
        ) or None

    def draft_layer(self) -> MTPLayer | None:
        """The first MTP layer (the one speculative decoding chains); None without MTP weights."""
        if self.mtp is None:
            return None
        layer = self.mtp[0]
        assert isinstance(layer, MTPLayer)
        return layer

    def drop_optional(self, group: str) -> None:
        """A checkpoint without MTP weights (as transformers saves DeepSeek-V3) leaves ``mtp`` None."""
        if group != MTP:
            super().drop_optional(group)
        self.mtp = None
