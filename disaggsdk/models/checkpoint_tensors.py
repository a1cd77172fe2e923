"""Every tensor of a model's Hugging Face checkpoint: its name, full shape, stored dtype and how a rank shards it.

The inventory is derived from the architecture alone (`ModelArch` and its config.json), so the plan can count
the bytes of a 685B-parameter checkpoint it never opens. Names and shapes are the ones the checkpoint stores
(``model.layers.3.mlp.experts.17.down_proj.weight``); dtypes are what the file holds: float8_e4m3fn for the
weights a block-FP8 checkpoint quantizes (`BlockFP8.is_quantized`), each followed by its float32
``weight_scale_inv``; the config's ``torch_dtype`` for the rest; float32 for DeepSeek's router bias.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

from disaggsdk.models.arch import DTYPE_BYTES, ModelArch
from disaggsdk.models.quantization import BlockFP8, block_fp8_of, scale_name

ShardKind = Literal["column", "row", "kv_heads", "replicated", "vocab"]
# What a tensor is for, as the memory plan reports it (a norm goes with the block it normalises the input of;
# an MoE layer's router and its post-attention norm go with "moe_router").
Part = Literal["attention", "dense_mlp", "moe_router", "routed_experts", "shared_experts", "embeddings"]
PARTS: tuple[Part, ...] = ("attention", "dense_mlp", "moe_router", "routed_experts", "shared_experts", "embeddings")
Group = Literal["model", "mtp"]

FP8_DTYPE = "float8_e4m3fn"
SCALE_DTYPE = "float32"  # DeepSeek's weight_scale_inv


@dataclass(frozen=True, slots=True)
class CheckpointTensor:
    """One tensor of the checkpoint."""

    name: str  # as the checkpoint stores it
    shape: tuple[int, ...]  # full shape in the checkpoint
    dtype: str  # stored dtype: "float8_e4m3fn", "bfloat16", "float32"...
    shard: ShardKind
    part: Part
    group: Group = "model"
    layer: int | None = None  # decoder layer index (the MTP layer's is num_hidden_layers + i)
    expert: int | None = None  # routed expert index, for a routed expert's tensors
    scale_of: str | None = None  # for a weight_scale_inv: the weight it scales

    @property
    def numel(self) -> int:
        """Elements of the full tensor."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the full tensor as stored."""
        return self.numel * DTYPE_BYTES[self.dtype]

    def local_shape(self, tp: int, tp_rank: int, num_kv_heads: int = 1, vocab_parallel: bool = False
                    ) -> tuple[int, ...]:
        """This tensor's shape on rank ``tp_rank`` of a ``tp``-way tensor-parallel group.

        Args:
            tp, tp_rank: the group size and the rank.
            num_kv_heads: the model's KV heads (``kv_heads`` tensors: rows per head = rows / heads).
            vocab_parallel: split ``vocab`` tensors by vocabulary (vLLM) instead of keeping them whole
                (this engine).
        Returns:
            The local shape (a scale tensor's follows its weight's blocks: rows of blocks split alike).
        """
        del tp_rank  # every split here is even (check_tp refuses others), so all ranks hold equal shapes
        if self.shard == "replicated" or tp == 1 or (self.shard == "vocab" and not vocab_parallel):
            return self.shape
        if self.shard == "kv_heads":
            per_head = self.shape[0] // num_kv_heads
            return (max(1, num_kv_heads // tp) * per_head, *self.shape[1:])
        dim = 1 if self.shard == "row" else 0
        shape = list(self.shape)
        shape[dim] = -(-shape[dim] // tp)
        return tuple(shape)


def checkpoint_tensors(arch: ModelArch) -> tuple[CheckpointTensor, ...]:
    """Every tensor of ``arch``'s Hugging Face checkpoint, in layer order, the MTP layer's last.

    The MTP layer is listed when config.json declares one (``num_nextn_predict_layers``), as DeepSeek's own
    checkpoint holds it; transformers' ``save_pretrained`` drops it, and so may a local directory.
    """
    return tuple(_tensors(arch, block_fp8_of(arch.hf_config, arch.name), str(arch.hf_config.get("torch_dtype",
                                                                                                  "bfloat16"))))


def _tensors(arch: ModelArch, fp8: BlockFP8 | None, dtype: str) -> Iterator[CheckpointTensor]:
    if dtype not in DTYPE_BYTES:
        dtype = "bfloat16"

    def tensor(name: str, shape: tuple[int, ...], shard: ShardKind, part: Part, group: Group = "model",
               layer: int | None = None, expert: int | None = None, stored: str | None = None
               ) -> Iterator[CheckpointTensor]:
        if fp8 is not None and stored is None and fp8.is_quantized(name, shape):
            yield CheckpointTensor(name, shape, FP8_DTYPE, shard, part, group, layer, expert)
            yield CheckpointTensor(scale_name(name), fp8.scale_shape(shape), SCALE_DTYPE, shard, part, group,
                                   layer, expert, scale_of=name)
        else:
            yield CheckpointTensor(name, shape, stored or dtype, shard, part, group, layer, expert)

    h, vocab = arch.hidden_size, arch.vocab_size
    yield from tensor("model.embed_tokens.weight", (vocab, h), "vocab", "embeddings")
    for i in range(arch.num_layers):
        yield from _layer(arch, i, "model", tensor)
    yield from tensor("model.norm.weight", (h,), "replicated", "embeddings")
    if not arch.hf_config.get("tie_word_embeddings", False):
        yield from tensor("lm_head.weight", (vocab, h), "vocab", "embeddings")
    if arch.family == "deepseek_v3":
        for k in range(arch.num_mtp_layers):
            i = arch.num_layers + k
            p = f"model.layers.{i}."
            yield from tensor(f"{p}embed_tokens.weight", (vocab, h), "vocab", "embeddings", "mtp", i)
            yield from tensor(f"{p}enorm.weight", (h,), "replicated", "embeddings", "mtp", i)
            yield from tensor(f"{p}hnorm.weight", (h,), "replicated", "embeddings", "mtp", i)
            yield from tensor(f"{p}eh_proj.weight", (h, 2 * h), "replicated", "embeddings", "mtp", i)
            yield from _layer(arch, i, "mtp", tensor)
            yield from tensor(f"{p}shared_head.norm.weight", (h,), "replicated", "embeddings", "mtp", i)
            yield from tensor(f"{p}shared_head.head.weight", (vocab, h), "vocab", "embeddings", "mtp", i)


def _layer(arch: ModelArch, i: int, group: Group, tensor: _TensorFn) -> Iterator[CheckpointTensor]:
    """The tensors of decoder layer ``i`` (attention, then its MLP or MoE)."""
    h = arch.hidden_size
    p = f"model.layers.{i}."
    yield from tensor(f"{p}input_layernorm.weight", (h,), "replicated", "attention", group, i)
    a = f"{p}self_attn."
    heads = arch.num_attention_heads
    if arch.attention == "mla":
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        if arch.q_lora_rank:
            yield from tensor(f"{a}q_a_proj.weight", (arch.q_lora_rank, h), "replicated", "attention", group, i)
            yield from tensor(f"{a}q_a_layernorm.weight", (arch.q_lora_rank,), "replicated", "attention", group, i)
            yield from tensor(f"{a}q_b_proj.weight", (heads * qk, arch.q_lora_rank), "column", "attention", group, i)
        else:
            yield from tensor(f"{a}q_proj.weight", (heads * qk, h), "column", "attention", group, i)
        yield from tensor(f"{a}kv_a_proj_with_mqa.weight", (arch.kv_lora_rank + arch.qk_rope_head_dim, h),
                          "replicated", "attention", group, i)
        yield from tensor(f"{a}kv_a_layernorm.weight", (arch.kv_lora_rank,), "replicated", "attention", group, i)
        yield from tensor(f"{a}kv_b_proj.weight", (heads * (arch.qk_nope_head_dim + arch.v_head_dim),
                                                   arch.kv_lora_rank), "column", "attention", group, i)
        yield from tensor(f"{a}o_proj.weight", (h, heads * arch.v_head_dim), "row", "attention", group, i)
    else:
        hd, kv = arch.head_dim, arch.num_kv_heads
        yield from tensor(f"{a}q_proj.weight", (heads * hd, h), "column", "attention", group, i)
        yield from tensor(f"{a}k_proj.weight", (kv * hd, h), "kv_heads", "attention", group, i)
        yield from tensor(f"{a}v_proj.weight", (kv * hd, h), "kv_heads", "attention", group, i)
        yield from tensor(f"{a}o_proj.weight", (h, heads * hd), "row", "attention", group, i)
        yield from tensor(f"{a}q_norm.weight", (hd,), "replicated", "attention", group, i)
        yield from tensor(f"{a}k_norm.weight", (hd,), "replicated", "attention", group, i)
    m = f"{p}mlp."
    if not is_moe_layer(arch, i):
        yield from tensor(f"{p}post_attention_layernorm.weight", (h,), "replicated", "dense_mlp", group, i)
        yield from _gated_mlp(m, arch.intermediate_size, h, "dense_mlp", group, i, tensor)
        return
    yield from tensor(f"{p}post_attention_layernorm.weight", (h,), "replicated", "moe_router", group, i)
    yield from tensor(f"{m}gate.weight", (arch.num_experts, h), "replicated", "moe_router", group, i)
    if arch.family == "deepseek_v3":
        yield from tensor(f"{m}gate.e_score_correction_bias", (arch.num_experts,), "replicated", "moe_router",
                          group, i, stored="float32")
    for e in range(arch.num_experts):
        yield from _gated_mlp(f"{m}experts.{e}.", arch.moe_intermediate_size, h, "routed_experts", group, i,
                              tensor, expert=e)
    if arch.num_shared_experts:
        yield from _gated_mlp(f"{m}shared_experts.", arch.moe_intermediate_size * arch.num_shared_experts, h,
                              "shared_experts", group, i, tensor)


def _gated_mlp(prefix: str, intermediate: int, h: int, part: Part, group: Group, layer: int, tensor: _TensorFn,
               expert: int | None = None) -> Iterator[CheckpointTensor]:
    yield from tensor(f"{prefix}gate_proj.weight", (intermediate, h), "column", part, group, layer, expert)
    yield from tensor(f"{prefix}up_proj.weight", (intermediate, h), "column", part, group, layer, expert)
    yield from tensor(f"{prefix}down_proj.weight", (h, intermediate), "row", part, group, layer, expert)


def is_moe_layer(arch: ModelArch, layer: int) -> bool:
    """Whether decoder layer ``layer`` is sparse (routed experts) rather than a dense MLP.

    DeepSeek-V3: every layer from ``first_k_dense_replace`` on (its MTP layer included). Qwen3-MoE: every
    layer on the ``decoder_sparse_step`` rhythm and not in ``mlp_only_layers``, as transformers builds it.
    """
    if not arch.is_moe:
        return False
    if arch.family == "deepseek_v3":
        return layer >= arch.first_k_dense
    config = arch.hf_config
    step = config.get("decoder_sparse_step", 1) or 1
    return layer not in (config.get("mlp_only_layers") or []) and (layer + 1) % step == 0


class _TensorFn(Protocol):
    """The signature of `_tensors`' local ``tensor`` helper (for the type checker)."""

    def __call__(self, name: str, shape: tuple[int, ...], shard: ShardKind, part: Part, group: Group = "model",
                 layer: int | None = None, expert: int | None = None, stored: str | None = None
                 ) -> Iterator[CheckpointTensor]: ...


Storage = Literal["fp8", "scale", "wide"]  # an FP8 weight, its block scale, or a 16/32-bit tensor


@dataclass(frozen=True)
class WeightTotals:
    """The checkpoint's elements summed by what decides a rank's share of them (one pass over the inventory).

    ``numel`` maps (group, part, shard kind, storage) to the elements of every tensor so keyed, routed experts
    excluded; ``expert_numel`` maps (group, storage) to the elements of ONE routed expert summed over every MoE
    layer of the group (all routed experts of a checkpoint have the same shapes).
    """

    numel: dict[tuple[Group, Part, ShardKind, Storage], int]
    expert_numel: dict[tuple[Group, Storage], int]
    num_params: dict[Group, int]  # parameters (scales excluded) per group
    total_bytes: int  # the whole checkpoint as stored


def storage_of(tensor: CheckpointTensor) -> Storage:
    """How ``tensor`` is stored: an FP8 weight, an FP8 weight's scale, or a wide (16/32-bit) tensor."""
    if tensor.scale_of is not None:
        return "scale"
    return "fp8" if tensor.dtype == FP8_DTYPE else "wide"


def weight_totals(arch: ModelArch) -> WeightTotals:
    """`WeightTotals` of ``arch``'s checkpoint (`checkpoint_tensors`), cached per architecture and config."""
    import json

    return _weight_totals_cached(arch, json.dumps(arch.hf_config, sort_keys=True, default=str))


@functools.lru_cache(maxsize=32)
def _weight_totals_cached(arch: ModelArch, config_key: str) -> WeightTotals:
    # config_key: ModelArch's equality ignores hf_config, which decides the dtypes (quantization_config)
    numel: dict[tuple[Group, Part, ShardKind, Storage], int] = {}
    expert: dict[tuple[Group, Storage], int] = {}
    params: dict[Group, int] = {}
    total = 0
    for t in checkpoint_tensors(arch):
        storage = storage_of(t)
        total += t.nbytes
        if storage != "scale":
            params[t.group] = params.get(t.group, 0) + t.numel
        if t.expert is not None:
            if t.expert == 0:
                expert[t.group, storage] = expert.get((t.group, storage), 0) + t.numel
            continue
        key = (t.group, t.part, t.shard, storage)
        numel[key] = numel.get(key, 0) + t.numel
    return WeightTotals(numel, expert, params, total)
