"""Qwen3-MoE (the Qwen3-Coder architecture): Qwen3 attention, sparse MoE MLP layers.

A layer is sparse unless listed in ``mlp_only_layers`` or off the ``decoder_sparse_step``
rhythm, as in transformers. Routing: softmax over experts, top-k, renormalised when
``norm_topk_prob``; each expert's intermediate dimension is split over the TP ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from disaggsdk.engine.modeling.layers.mlp import GatedMLP
from disaggsdk.engine.modeling.layers.moe import Experts, SoftmaxTopKRouter
from disaggsdk.engine.modeling.qwen3 import Qwen3ForCausalLM
from disaggsdk.engine.parallel import TensorParallel

if TYPE_CHECKING:
    from disaggsdk.models.arch import ModelArch


class Qwen3MoeBlock(nn.Module):
    """Router + experts; returns this rank's partial sum (the decoder layer all-reduces)."""

    def __init__(self, prefix: str, arch: ModelArch, tp: TensorParallel, dtype: torch.dtype):
        super().__init__()
        self.gate = SoftmaxTopKRouter(
            f"{prefix}gate.weight", arch.num_experts, arch.hidden_size, arch.num_experts_per_tok,
            bool(arch.hf_config.get("norm_topk_prob", False)), dtype,
        )
        self.experts = Experts(f"{prefix}experts.", arch.num_experts, arch.hidden_size,
                               arch.moe_intermediate_size, tp, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        return self.experts(x, ids, weights)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, layer_id: int, prefix: str) -> nn.Module:
        config = self.arch.hf_config
        step = config.get("decoder_sparse_step", 1) or 1
        sparse = (
            layer_id not in (config.get("mlp_only_layers") or [])
            and self.arch.num_experts > 0
            and (layer_id + 1) % step == 0
        )
        if sparse:
            return Qwen3MoeBlock(prefix, self.arch, self.tp, self.dtype)
        return GatedMLP(prefix, self.arch.hidden_size, self.arch.intermediate_size, self.tp, self.dtype)
