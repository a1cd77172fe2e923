"""The attention backend contract: `plan()` once per step, `run()` once per layer.

A backend owns nothing of the model; it owns the step's paged-KV metadata and reads/writes the KV
cache of the rank. `run` first stores the new tokens' K and V (or MLA latent) at
``batch.kv_slot_ids`` and then attends causally over each request's whole KV.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.forward_batch import ForwardBatch


class LayerAttention(Protocol):
    """What a model's layer calls: attention of one layer over a step already planned (a backend,
    or the graph ops that reach one from a compiled step, engine.graph_ops.GraphAttention)."""

    def run(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """GQA attention of one layer.

        Args:
            q: [num_tokens, num_q_heads_local, head_dim]
            k: [num_tokens, num_kv_heads_local, head_dim], new tokens only (rope applied)
            v: [num_tokens, num_kv_heads_local, head_dim]
            sm_scale: softmax scale, usually head_dim ** -0.5
        Returns:
            [num_tokens, num_q_heads_local, head_dim]
        """

    def run_mla(self, layer_id: int, q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor,
                k_rope: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """MLA attention of one layer in the absorbed form (as FlashInfer's MLA wrapper takes it).

        The cache stores per token ``[kv_latent | k_rope]``; scores are
        ``q_latent . kv_latent + q_rope . k_rope`` and the output is the weighted sum of kv_latent.

        Args:
            q_latent: [num_tokens, num_heads_local, kv_lora_rank], q_nope absorbed through W_UK
            q_rope: [num_tokens, num_heads_local, qk_rope_head_dim] (rope applied)
            kv_latent: [num_tokens, kv_lora_rank], new tokens only (normalised compressed KV)
            k_rope: [num_tokens, qk_rope_head_dim], new tokens only (rope applied)
            sm_scale: softmax scale of the un-absorbed head dim (qk_nope + qk_rope) ** -0.5
        Returns:
            [num_tokens, num_heads_local, kv_lora_rank], to be projected through W_UV
        """


class AttentionBackend(LayerAttention, Protocol):
    """Paged attention over one rank's KV cache."""

    def plan(self, batch: ForwardBatch) -> None:
        """Prepare per-step metadata (indices, masks) for every layer of this step."""
