"""What a model is to the runtime: the `CausalLM` protocol and the KV geometry of one rank.

The runtime never looks inside a model. It sizes the KV pool from `kv_geometry`, calls
`forward` once per step with a `ForwardBatch` and an attention backend, and turns the hidden
states it wants into logits with `compute_logits`. Nothing here imports torch, so the planner
and the CLI can ask for the geometry without loading the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from disaggsdk.errors import ModelError

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.attention.base import LayerAttention
    from disaggsdk.engine.forward_batch import ForwardBatch
    from disaggsdk.engine.modeling.layers.decoder import DecoderModel
    from disaggsdk.engine.parallel import TensorParallel
    from disaggsdk.models.arch import ModelArch


@dataclass(frozen=True)
class KVGeometry:
    """Shape of the KV cache one rank keeps per token per layer.

    GQA: each token stores K and V of ``num_kv_heads_local`` heads of ``head_dim`` values.
    MLA: each token stores one latent of ``latent_dim = kv_lora_rank + qk_rope_head_dim`` values
    (normalised compressed KV, then the rope key), identical on every rank; ``num_kv_heads_local``
    is 1 and ``head_dim`` is the un-absorbed query/key dim (qk_nope + qk_rope) that sets the
    softmax scale.
    """

    attention: Literal["gqa", "mla"]
    num_layers: int
    num_kv_heads_local: int
    head_dim: int
    latent_dim: int = 0  # MLA only
    num_q_heads_local: int = 0
    kv_lora_rank: int = 0  # MLA only: the first kv_lora_rank values of the latent
    qk_rope_head_dim: int = 0  # MLA only: the last qk_rope_head_dim values of the latent

    @property
    def values_per_token_layer(self) -> int:
        """Cache elements one token adds to one layer on this rank (K and V, or the latent)."""
        if self.attention == "mla":
            return self.latent_dim
        return 2 * self.num_kv_heads_local * self.head_dim


def check_tp(arch: ModelArch, tp_size: int) -> None:
    """Check that ``arch`` can be split over ``tp_size`` ranks.

    Raises:
        ModelError: a head count or intermediate size does not divide (the message names it).
    """
    if tp_size < 1:
        raise ModelError(f"tp must be at least 1, got {tp_size}")
    problems = []
    if arch.num_attention_heads % tp_size:
        problems.append(f"num_attention_heads={arch.num_attention_heads}")
    if arch.attention == "gqa":
        kv = arch.num_kv_heads
        if (tp_size <= kv and kv % tp_size) or (tp_size > kv and tp_size % kv):
            problems.append(f"num_key_value_heads={kv} (tp must divide it or be a multiple of it)")
    if arch.intermediate_size % tp_size:
        problems.append(f"intermediate_size={arch.intermediate_size}")
    if arch.moe_intermediate_size % tp_size:
        problems.append(f"moe_intermediate_size={arch.moe_intermediate_size}")
    if problems:
        raise ModelError(f"{arch.name} cannot be split over tp={tp_size}: {', '.join(problems)} is not divisible;"
                         f" choose a tp that divides these")


# config.json fields the engine does not implement, with the values it does; a checkpoint that
# sets one otherwise would load and run, but compute something else than the model.
SUPPORTED_VALUES = {
    "hidden_act": ("silu",),
    "attention_bias": (False, None),
    "use_sliding_window": (False, None),
}


def check_supported(arch: ModelArch) -> None:
    """Refuse config.json settings the engine would silently get wrong.

    A ``quantization_config`` is supported when it is block-scaled FP8 (`block_fp8_of` says why not
    otherwise); the loader dequantizes those weights.

    Raises:
        ModelError: naming the first unsupported field and its value.
    """
    from disaggsdk.models.quantization import block_fp8_of

    for field, allowed in SUPPORTED_VALUES.items():
        value = arch.hf_config.get(field)
        if value not in allowed:
            raise ModelError(f"{arch.name}: config.json field {field!r} is {value!r}; the engine supports "
                             f"{' or '.join(repr(a) for a in allowed if a is not None) or 'only its absence'}")
    block_fp8_of(arch.hf_config, arch.name)


def kv_geometry(arch: ModelArch, tp: TensorParallel, extra_layers: int = 0) -> KVGeometry:
    """The KV cache geometry of one rank of a ``tp.size``-way instance.

    Args:
        arch: the model's architecture.
        tp: this rank's tensor-parallel context (only ``rank`` and ``size`` are read).
        extra_layers: KV layers after the model's own (the MTP layer's, when the instance drafts).
    Returns:
        The per-rank geometry; GQA KV heads are split (or replicated once tp exceeds them),
        the MLA latent is replicated.
    Raises:
        ModelError: the model cannot be split over ``tp.size`` ranks.
    """
    check_tp(arch, tp.size)
    num_q_heads_local = arch.num_attention_heads // tp.size
    if arch.attention == "mla":
        return KVGeometry(
            attention="mla",
            num_layers=arch.num_layers + extra_layers,
            num_kv_heads_local=1,
            head_dim=arch.qk_nope_head_dim + arch.qk_rope_head_dim,
            latent_dim=arch.kv_lora_rank + arch.qk_rope_head_dim,
            num_q_heads_local=num_q_heads_local,
            kv_lora_rank=arch.kv_lora_rank,
            qk_rope_head_dim=arch.qk_rope_head_dim,
        )
    start, stop = tp.kv_head_range(arch.num_kv_heads)
    return KVGeometry(
        attention="gqa",
        num_layers=arch.num_layers + extra_layers,
        num_kv_heads_local=stop - start,
        head_dim=arch.head_dim,
        num_q_heads_local=num_q_heads_local,
    )


class DraftLayer(Protocol):
    """A model's multi-token-prediction layer (DeepSeek's MTP), which speculative decoding runs
    after every target step: it reads the target's hidden state h_i and the token t_{i+1} after it,
    and proposes t_{i+2}. Its attention keeps its own KV layer (after the model's own)."""

    def __call__(self, hidden_prev: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                 attn: LayerAttention, on_layer_done: Callable[[int, torch.Tensor], None] | None = None,
                 ) -> torch.Tensor:
        """The layer's hidden states [n, hidden] for every row (its KV written)."""
        ...

    def draft(self, hidden_prev: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
              attn: LayerAttention, rows: torch.Tensor,
              on_layer_done: Callable[[int, torch.Tensor], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer over every row, then the hidden states of ``rows`` and their greedy drafts
        (int64 [len(rows)])."""
        ...

    def share_with(self, model: DecoderModel) -> int:
        """Use the target's tensors where the layer's are copies of them; returns how many."""
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits [n, vocab_size] (float32) of the layer's hidden states."""
        ...


class CausalLM(Protocol):
    """A decoder-only model sharded over one tensor-parallel group (an ``nn.Module``).

    ``forward`` runs ``arch.num_layers`` layers (an MTP layer, when the model has one, is its
    ``draft_layer()`` and not run) and calls ``batch.on_layer_done(layer_id, output)`` after each layer's
    attention output projection and its all-reduce, on the head rank only.
    """

    arch: ModelArch
    tp: TensorParallel

    def forward(self, batch: ForwardBatch, attn: LayerAttention) -> torch.Tensor:
        """Hidden states after the final norm.

        Args:
            batch: the step's tokens and paged-KV metadata.
            attn: the attention backend, already ``plan``-ned for ``batch``.
        Returns:
            [num_tokens, hidden_size], the model's dtype.
        """
        ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the full vocabulary, identical on every rank.

        Args:
            hidden: [n, hidden_size] rows of ``forward``'s output.
        Returns:
            [n, vocab_size], float32.
        """
        ...

    def draft_layer(self) -> DraftLayer | None:
        """The model's MTP layer for speculative drafting; None where the family has none or
        the checkpoint lacks its weights."""
        ...
