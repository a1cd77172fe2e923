"""DeepSeek-V3's multi-token-prediction (MTP) layer, for training on top of transformers' model.

transformers' DeepseekV3 has no MTP layer (its checkpoints drop layer ``num_hidden_layers``), so the
training tool adds one as DeepSeek-V3 describes it (arXiv 2412.19437, section 2.2): for position i,

    h'_i = eh_proj([enorm(embed(t_{i+1})) | hnorm(h_i)])      # h_i: the main model's final hidden state
    logits_i = head(shared_head.norm(block(h'_i)))             # predicts t_{i+2}

with ``block`` one more decoder layer (MLA attention, causal over the h' sequence; MoE) and
``embed``/``head`` shared with the main model. The concatenation order (embedding first) and the
post-norm hidden state are those vLLM's DeepSeek MTP reads. Positions do not matter to it beyond
order: rotary attention only sees differences, so the block reuses the main model's positions.

Saved in DeepSeek's checkpoint layout under ``model.layers.{num_hidden_layers}.`` with the shared
embedding and head copied (as DeepSeek ships them), experts one tensor per expert and projection.
"""

from __future__ import annotations

import torch
from torch import nn


class MTPLayer(nn.Module):
    """One MTP module over a transformers ``DeepseekV3ForCausalLM`` (``main``, not owned)."""

    def __init__(self, main: nn.Module):
        super().__init__()
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer, DeepseekV3RMSNorm

        config = main.config
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.layer_index = config.num_hidden_layers
        self.enorm = DeepseekV3RMSNorm(hidden, eps)
        self.hnorm = DeepseekV3RMSNorm(hidden, eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.block = DeepseekV3DecoderLayer(config, layer_idx=self.layer_index)  # index >= first_k_dense: MoE
        self.shared_head_norm = DeepseekV3RMSNorm(hidden, eps)
        for module in self.modules():
            main._init_weights(module)  # transformers' own initialisation, fused experts included
        self._main = [main]  # a list: the main model is shared, not a submodule of this one

    def forward(self, hidden: torch.Tensor, next_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Logits for t_{i+2} at every position i.

        Args:
            hidden: the main model's final (normed) hidden states h_i, [batch, seq, hidden].
            next_ids: t_{i+1} for each position, [batch, seq].
            position_ids: [batch, seq].
        """
        main = self._main[0]
        embedded = self.enorm(main.model.embed_tokens(next_ids))
        x = self.eh_proj(torch.cat([embedded, self.hnorm(hidden)], dim=-1))
        rotary = main.model.rotary_emb(x, position_ids)
        x = self.block(x, attention_mask=None, position_ids=position_ids, position_embeddings=rotary)
        return main.lm_head(self.shared_head_norm(x))

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of this layer under DeepSeek's checkpoint names (experts unfused)."""
        main = self._main[0]
        p = f"model.layers.{self.layer_index}."
        out = {
            f"{p}embed_tokens.weight": main.model.embed_tokens.weight,
            f"{p}enorm.weight": self.enorm.weight,
            f"{p}hnorm.weight": self.hnorm.weight,
            f"{p}eh_proj.weight": self.eh_proj.weight,
            f"{p}shared_head.norm.weight": self.shared_head_norm.weight,
            f"{p}shared_head.head.weight": main.lm_head.weight,
        }
        for name, tensor in self.block.state_dict().items():
            if name == "mlp.experts.gate_up_proj":
                gate, up = tensor.chunk(2, dim=1)  # [experts, 2 * inter, hidden]: gate rows first
                for e in range(tensor.shape[0]):
                    out[f"{p}mlp.experts.{e}.gate_proj.weight"] = gate[e]
                    out[f"{p}mlp.experts.{e}.up_proj.weight"] = up[e]
            elif name == "mlp.experts.down_proj":
                for e in range(tensor.shape[0]):
                    out[f"{p}mlp.experts.{e}.down_proj.weight"] = tensor[e]
            else:
                out[p + name] = tensor
        return {k: v.detach().contiguous() for k, v in out.items()}


def load_mtp(main: nn.Module, tensors: dict[str, torch.Tensor]) -> MTPLayer:
    """The MTP layer of a saved checkpoint (``tensors``: its safetensors) over ``main``.

    Raises:
        KeyError: the checkpoint has no MTP layer.
    """
    mtp = MTPLayer(main)
    p = f"model.layers.{mtp.layer_index}."
    experts = mtp.block.mlp.experts.num_experts
    own = {"enorm.weight": "enorm.weight", "hnorm.weight": "hnorm.weight", "eh_proj.weight": "eh_proj.weight",
           "shared_head.norm.weight": "shared_head_norm.weight"}
    state = {mine: tensors[p + theirs] for theirs, mine in own.items()}
    for name in mtp.block.state_dict():
        if name == "mlp.experts.gate_up_proj":
            state["block." + name] = torch.stack([
                torch.cat([tensors[f"{p}mlp.experts.{e}.gate_proj.weight"], tensors[f"{p}mlp.experts.{e}.up_proj.weight"]])
                for e in range(experts)])
        elif name == "mlp.experts.down_proj":
            state["block." + name] = torch.stack([tensors[f"{p}mlp.experts.{e}.down_proj.weight"] for e in range(experts)])
        else:
            state["block." + name] = tensors[p + name]
    mtp.load_state_dict({k: v.float() for k, v in state.items()})
    return mtp


def mtp_loss(mtp: MTPLayer, hidden: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the MTP layer on a batch of ``seq + 1`` token windows.

    ``hidden`` is the main model's output on ``batch[:, :-1]``; position i (0..seq-2) sees
    h_i and t_{i+1} and is scored on t_{i+2}.
    """
    seq = hidden.shape[1]
    positions = torch.arange(seq - 1).expand(batch.shape[0], -1)
    logits = mtp(hidden[:, :-1], batch[:, 1:seq], positions)
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 2:].reshape(-1))
