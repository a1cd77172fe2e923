"""The pre-norm decoder layer and the decoder-only model around it (embedding, layers, final norm,
lm_head), shared by every family; a family supplies its attention and MLP per layer."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from disaggsdk.engine.modeling.layers import amx_linear, skinny
from disaggsdk.engine.modeling.layers.norm import RMSNorm
from disaggsdk.engine.modeling.layers.rope import RotaryEmbedding
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.engine.weights import WeightOwner, WeightSlot

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import LayerAttention
    from disaggsdk.engine.forward_batch import ForwardBatch
    from disaggsdk.engine.modeling.base import DraftLayer
    from disaggsdk.models.arch import ModelArch


class Embedding(nn.Module):
    """A token embedding (or an lm_head) every rank holds whole: tiny models do not need a
    vocabulary split, and a whole lm_head gives every rank the full logits without a gather."""

    def __init__(self, name: str, vocab_size: int, hidden_size: int, dtype: torch.dtype,
                 optional_group: str | None = None):
        super().__init__()
        self.name = name
        self.optional_group = optional_group
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)
        # weight: [vocab_size, hidden_size]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)

    def own_slots(self) -> Iterator[WeightSlot]:
        yield WeightSlot(self.name, self.weight.data, tuple(self.weight.shape), optional_group=self.optional_group)


class DecoderLayer(nn.Module):
    """x + attn(norm(x)), then + mlp(norm(.)); all-reduces each sum of partial outputs."""

    def __init__(self, prefix: str, layer_id: int, self_attn: nn.Module, mlp: nn.Module, hidden_size: int,
                 eps: float, tp: TensorParallel, dtype: torch.dtype, optional_group: str | None = None):
        super().__init__()
        self.layer_id = layer_id
        self.tp = tp
        self.input_layernorm = RMSNorm(f"{prefix}input_layernorm.weight", hidden_size, eps, dtype, optional_group)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(
            f"{prefix}post_attention_layernorm.weight", hidden_size, eps, dtype, optional_group
        )
        self.mlp = mlp

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                on_layer_done: Callable[[int, torch.Tensor], None] | None, attn: LayerAttention) -> torch.Tensor:
        if x.shape[0] == 0:
            # an idle rank of a lock-step dp group (engine.dp_lockstep): no attention, but a MoE
            # layer's expert exchange needs every rank. Its tp ranks are all idle (they run one
            # batch), so they all skip the all-reduces, which have nothing to sum
            return x + self.mlp(self.post_attention_layernorm(x))
        h = self.tp.all_reduce(self.self_attn(self.input_layernorm(x), cos, sin, attn, self.layer_id))
        # The all-reduce has synchronised the ranks, so the head rank alone speaks for the layer.
        # The layer's output goes along: a compiled graph's counter op must come after it.
        if on_layer_done is not None and self.tp.is_head:
            on_layer_done(self.layer_id, h)
        x = x + h
        return x + self.tp.all_reduce(self.mlp(self.post_attention_layernorm(x)))


class DecoderModel(nn.Module):
    """Embedding, ``arch.num_layers`` decoder layers, final norm and lm_head (the CausalLM API).

    Subclasses build ``self.layers`` and ``self.rotary`` in their ``__init__`` after calling
    this one.
    """

    rotary: RotaryEmbedding  # built by the family's __init__ (its rope settings)
    packed_head: torch.Tensor | None  # a buffer: amx_linear.pack(head), or None

    def __init__(self, arch: ModelArch, tp: TensorParallel, dtype: torch.dtype):
        super().__init__()
        config = arch.hf_config
        self.arch = arch
        self.tp = tp
        self.dtype = dtype
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.embed_tokens = Embedding("model.embed_tokens.weight", arch.vocab_size, arch.hidden_size, dtype)
        self.norm = RMSNorm("model.norm.weight", arch.hidden_size, self.eps, dtype)
        self.tie_word_embeddings = bool(config.get("tie_word_embeddings", False))
        self.lm_head = (
            None if self.tie_word_embeddings
            else Embedding("lm_head.weight", arch.vocab_size, arch.hidden_size, dtype)
        )
        self.layers = nn.ModuleList()
        self.register_buffer("packed_head", None, persistent=False)  # amx_linear.pack(head), or None

    def forward(self, batch: ForwardBatch, attn: LayerAttention) -> torch.Tensor:
        """Hidden states after the final norm, [num_tokens, hidden_size]."""
        return self.forward_tokens(batch.input_ids, batch.positions, attn, batch.on_layer_done)

    def forward_tokens(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: LayerAttention,
                       on_layer_done: Callable[[int, torch.Tensor], None] | None = None) -> torch.Tensor:
        """`forward` on the batch's tensors alone: what a compiled step traces (engine.compiled_step.torch_compile)."""
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, on_layer_done, attn)
        return self.norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, vocab_size] float32 logits of hidden [n, hidden_size]; identical on every rank."""
        return skinny.linear(hidden, self._head_weight(), self.packed_head).float()

    def _head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def pack_for_decode(self) -> int:
        """Keep the head in the AMX kernel's layout too, where that kernel runs (amx_linear).
        Returns how many tensors were packed (0 or 1)."""
        self.packed_head = amx_linear.pack_if_useful(self._head_weight())
        return int(self.packed_head is not None)

    def weight_slots(self) -> Iterator[WeightSlot]:
        """Every checkpoint tensor this rank holds a slice of, in module order."""
        for module in self.modules():
            if isinstance(module, WeightOwner):
                yield from module.own_slots()

    def draft_layer(self) -> DraftLayer | None:
        """The MTP layer speculative decoding drafts with; None here (a family with one says)."""
        return None

    def drop_optional(self, group: str) -> None:
        """Forget an optional weight group a checkpoint lacks (see `load_checkpoint`)."""
        raise AssertionError(f"{type(self).__name__} has no optional weight group {group!r}")
