"""The kernels of one engine step, one device's view: their shapes, their times, and the seam a cost source fills.

A step as vLLM and SGLang run it is, per layer: the qkv (or MLA) projections (`Gemm`), attention over
each prefill chunk and over the decode batch (`Attention`), the output projection (`Gemm`), a
tensor-parallel all-reduce (`AllReduce`), then a dense MLP (`Gemm`s and an `Elementwise` activation)
or a MoE layer (a DeepEP dispatch and combine, `ExpertExchange`, around the routed experts,
`MoeExperts`); and once per step the embedding and the LM head. Every shape is what ONE device runs:
heads, features and tokens after the tensor-parallel and expert-parallel splits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

import attrs

from disaggsdk.models.arch import AttentionKind, ModelArch

# bfloat16; fp8: per-tensor scaled FP8; fp8_block: 128x128 block-scaled FP8 (DeepSeek-V3/R1 and
# Qwen3-*-FP8 checkpoints: what the simulator's weight_dtype "fp8" means)
GemmDtype = Literal["bfloat16", "fp8", "fp8_block"]
KvDtype = Literal["bfloat16", "fp8"]
Phase = Literal["context", "generation"]  # prefill chunks | decode steps
Fit = Literal["exact", "interpolated", "extrapolated", "roofline"]

_positive = attrs.validators.ge(1)
_non_negative = attrs.validators.ge(0)


def gemm_dtype(weight_dtype: str) -> GemmDtype:
    """The GEMM dtype of a simulation's ``weight_dtype``: "fp8" checkpoints are block-FP8 (see
    `disaggsdk.models.quantization`), every 16- or 32-bit dtype runs as bfloat16 on a GPU."""
    return "fp8_block" if weight_dtype == "fp8" else "bfloat16"


@attrs.frozen
class Gemm:
    """One dense matrix multiply on one device: ``batch`` independent ``[m, k] @ [k, n]`` products.

    ``batch`` is 1 for a linear layer; MLA's absorbed decode projections are batched over heads
    (``batch`` = heads on the device): q_nope into the latent (``k`` = qk_nope_head_dim, ``n`` =
    kv_lora_rank) before attention, the latent out to values (``k`` = kv_lora_rank, ``n`` = v_head_dim) after.
    """

    m: int = attrs.field(validator=_positive)  # rows: tokens this device multiplies
    n: int = attrs.field(validator=_positive)  # output features on this device (after the tp split)
    k: int = attrs.field(validator=_positive)  # input features on this device
    dtype: GemmDtype = "bfloat16"  # of the weights (activations are quantized to match for fp8)
    batch: int = attrs.field(default=1, validator=_positive)

    @property
    def kind(self) -> str:
        return "gemm" if self.batch == 1 else "batched_gemm"


@attrs.frozen
class Attention:
    """The attention kernel of one layer on one device, projections excluded.

    ``batch`` sequences each bring ``new_tokens`` queries after ``cached_tokens`` already in the KV cache:
    a prefill chunk (``phase`` "context": its chunk length after its cached prefix) or a decode step
    (``phase`` "generation": 1 query, or 1 + draft tokens when speculating, after the sequence's KV length).

    GQA: ``head_dim`` is that of q, k and v. MLA (DeepSeek): prefill runs attention over the expanded
    K and V (``head_dim`` = qk_nope + qk_rope, ``v_head_dim`` the value width; the kv_b expansion is a
    `Gemm`); decode runs in the absorbed form over the cached latent (``kv_lora_rank`` + ``qk_rope_head_dim``
    values a token; the q and o absorptions are batched `Gemm` calls). ``num_kv_heads`` is 1 for MLA.
    """

    phase: Phase
    attention: AttentionKind  # "gqa" | "mla", as `ModelArch.attention`
    batch: int = attrs.field(validator=_positive)  # sequences
    new_tokens: int = attrs.field(validator=_positive)  # queries per sequence
    cached_tokens: int = attrs.field(validator=_non_negative)  # KV tokens per sequence before the new ones
    num_heads: int = attrs.field(validator=_positive)  # query heads on this device
    num_kv_heads: int = attrs.field(validator=_positive)  # KV heads on this device (1 for MLA)
    head_dim: int = attrs.field(validator=_positive)
    v_head_dim: int = attrs.field(validator=_positive)
    kv_dtype: KvDtype = "bfloat16"
    kv_lora_rank: int = 0  # MLA latent width (512 for DeepSeek-V3/R1); 0 for GQA
    qk_rope_head_dim: int = 0  # MLA decoupled rope width (64); 0 for GQA
    window: int = attrs.field(default=0, validator=_non_negative)  # sliding window, 0: none

    @property
    def kind(self) -> str:
        return f"{self.attention}_{self.phase}"

    @property
    def context_pairs(self) -> int:
        """Sum over all queries of the KV positions each attends to (causal within the new tokens)."""
        n, c = self.new_tokens, self.cached_tokens
        return self.batch * (n * c + n * (n + 1) // 2)


def attention_shape(arch: ModelArch, phase: Phase, tp: int, batch: int, new_tokens: int, cached_tokens: int,
                    kv_dtype: KvDtype = "bfloat16") -> Attention:
    """The `Attention` one device of a ``tp``-way attention group runs for ``arch`` (heads split by tp;
    GQA KV heads split while tp <= their count, replicated beyond; the MLA latent replicated)."""
    heads = max(1, arch.num_attention_heads // tp)
    if arch.attention == "mla":
        return Attention(phase, "mla", batch, new_tokens, cached_tokens, num_heads=heads, num_kv_heads=1,
                         head_dim=arch.qk_nope_head_dim + arch.qk_rope_head_dim, v_head_dim=arch.v_head_dim,
                         kv_dtype=kv_dtype, kv_lora_rank=arch.kv_lora_rank, qk_rope_head_dim=arch.qk_rope_head_dim)
    return Attention(phase, "gqa", batch, new_tokens, cached_tokens, num_heads=heads,
                     num_kv_heads=max(1, arch.num_kv_heads // tp), head_dim=arch.head_dim, v_head_dim=arch.head_dim,
                     kv_dtype=kv_dtype)


@attrs.frozen
class MoeExperts:
    """The routed experts of one MoE layer on one device: gate_up and down grouped GEMMs with the
    activation between them; the router, the shared experts (dense `Gemm` calls) and the token exchange
    (`ExpertExchange`) excluded.

    ``num_tokens`` counts the tokens entering the layer over the whole expert-parallel group (the
    tables' convention: the device computes its ``1 / moe_ep`` share of their ``topk`` routes, under
    balanced routing; load imbalance is a factor the composer states, not a table column).
    ``deepep``: the experts are fed by DeepEP (SGLang's wide-EP path, DeepGEMM's grouped layouts, the
    context and generation layouts differing) rather than by a fused MoE kernel.
    """

    num_tokens: int = attrs.field(validator=_positive)
    hidden_size: int = attrs.field(validator=_positive)
    inter_size: int = attrs.field(validator=_positive)  # one expert's intermediate size, before the moe_tp split
    topk: int = attrs.field(validator=_positive)
    num_experts: int = attrs.field(validator=_positive)  # routed experts of the model
    moe_tp: int = attrs.field(default=1, validator=_positive)
    moe_ep: int = attrs.field(default=1, validator=_positive)
    dtype: GemmDtype = "bfloat16"
    phase: Phase = "context"
    deepep: bool = False

    @property
    def kind(self) -> str:
        return "moe_experts"


@attrs.frozen
class AllReduce:
    """One all-reduce of a tensor-parallel group, seen from one rank (e.g. after attention's o_proj)."""

    ranks: int = attrs.field(validator=attrs.validators.ge(2))
    elements: int = attrs.field(validator=_positive)  # of the reduced tensor on each rank: tokens x hidden
    nodes: int = attrs.field(default=1, validator=_positive)
    dtype: Literal["bfloat16", "fp8"] = "bfloat16"
    backend: Literal["custom", "nccl"] = "custom"  # the engines' custom all-reduce (CUDA graphs) or NCCL

    @property
    def kind(self) -> str:
        return "all_reduce"


@attrs.frozen
class ExpertExchange:
    """One DeepEP dispatch or combine of a MoE layer, seen from one rank of the expert-parallel group.

    ``mode`` "normal" is DeepEP's high-throughput kernels (prefill), "low_latency" its decode kernels.
    """

    phase: Literal["dispatch", "combine"]
    mode: Literal["normal", "low_latency"]
    tokens: int = attrs.field(validator=_positive)  # tokens this rank dispatches (its share of the step)
    hidden_size: int = attrs.field(validator=_positive)
    topk: int = attrs.field(validator=_positive)
    num_experts: int = attrs.field(validator=_positive)
    ranks: int = attrs.field(validator=attrs.validators.ge(2))  # the expert-parallel group
    nodes: int = attrs.field(default=1, validator=_positive)
    dtype: Literal["bfloat16", "fp8"] = "bfloat16"  # of the rows on the wire

    @property
    def kind(self) -> str:
        return f"ep_{self.phase}"


Collective = AllReduce | ExpertExchange


@attrs.frozen
class Elementwise:
    """A memory-bound pass over activations on one device.

    ``op``: "embedding" (gather ``tokens`` rows of ``width`` = hidden), "rmsnorm" (read and write
    ``tokens x width``, fused residual add included), "activation" (SiLU-and-mul: read gate and up,
    ``2 x width``, write ``width`` = the intermediate size on the device).
    """

    op: Literal["embedding", "rmsnorm", "activation"]
    tokens: int = attrs.field(validator=_positive)
    width: int = attrs.field(validator=_positive)
    dtype: Literal["bfloat16", "float32"] = "bfloat16"

    @property
    def kind(self) -> str:
        return self.op


Kernel = Gemm | Attention | MoeExperts | AllReduce | ExpertExchange | Elementwise
# every ``Kernel.kind``: what a step's time and its sources are accounted by
KERNEL_KINDS = ("gemm", "batched_gemm", "gqa_context", "gqa_generation", "mla_context", "mla_generation",
                "moe_experts", "all_reduce", "ep_dispatch", "ep_combine", "embedding", "rmsnorm", "activation")


@attrs.frozen
class KernelTime:
    """What one kernel call costs and where the figure came from.

    ``source`` names the table (package version, path, slice and how many of its points monotone
    cleaning moved) or the roofline's profile; ``fit`` says how: exactly a measured point, interpolated
    between measured neighbours, extrapolated past them (the rule named in `grid_interp`), or the roofline.
    """

    seconds: float
    source: str
    fit: Fit


class KernelCosts(Protocol):
    """A source of kernel times. A method answers None where the source does not cover the shape
    (a GPU, dtype, head count or kernel its tables lack); `roofline_kernels.RooflineKernels` never does."""

    def gemm(self, shape: Gemm) -> KernelTime | None: ...

    def attention(self, shape: Attention) -> KernelTime | None: ...

    def moe_experts(self, shape: MoeExperts) -> KernelTime | None: ...

    def collective(self, shape: Collective) -> KernelTime | None: ...

    def elementwise(self, shape: Elementwise) -> KernelTime | None: ...


class CompleteKernelCosts(Protocol):
    """Kernel times for every shape, and the account of where they came from: what a step composer takes
    (`layered_kernels.LayeredKernels`)."""

    def gemm(self, shape: Gemm) -> KernelTime: ...

    def attention(self, shape: Attention) -> KernelTime: ...

    def moe_experts(self, shape: MoeExperts) -> KernelTime: ...

    def collective(self, shape: Collective) -> KernelTime: ...

    def elementwise(self, shape: Elementwise) -> KernelTime: ...

    def sources(self) -> Mapping[str, str]:
        """Kernel kind (``Kernel.kind``: "gemm", "mla_generation", "ep_dispatch", ...) -> the sources that
        answered it so far, with how many calls each fit."""
        ...
