"""A GPU engine's step, composed kernel by kernel as vLLM and SGLang run a layer."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Literal

import attrs

from disaggsdk.models import ModelArch
from disaggsdk.sim.kernels import (
    AllReduce,
    Attention,
    CompleteKernelCosts,
    Elementwise,
    ExpertExchange,
    Gemm,
    GemmDtype,
    Kernel,
    KvDtype,
    MoeExperts,
    attention_shape,
)
from disaggsdk.sim.step_batch import StepBatch


def captured_batch(seqs: int, max_batch: int) -> int | None:
    """The CUDA-graph batch a decode step of ``seqs`` sequences runs as (1, 2, 4, then the next
    multiple of 8), or None when it is larger than ``max_batch`` (run eagerly)."""
    if seqs > max_batch:
        return None
    for size in (1, 2, 4):
        if seqs <= size:
            return size
    return min(max_batch, 8 * math.ceil(seqs / 8))


def canonical_batch(batch: StepBatch) -> StepBatch:
    """``batch`` with its decode sequences' mean context rounded to 1/32 of the power of two below it
    (to the token under 32): the batch `EngineStep` prices in its place."""
    if not batch.decode_seqs:
        return batch
    mean = batch.decode_context_tokens / batch.decode_seqs
    step = max(1, 2 ** max(0, int(mean).bit_length() - 6))
    return attrs.evolve(batch, decode_context_tokens=float(batch.decode_seqs * step * round(mean / step)))


@attrs.frozen
class GroupWork:
    """One dp group's share of a step: its decode sequences and its prefill chunks."""

    decode_seqs: int
    decode_context_tokens: float
    chunks: tuple[tuple[int, int], ...]


def split_over_groups(batch: StepBatch, dp: int) -> list[GroupWork]:
    """The batch shared by ``dp`` groups as the router keeps them: decode sequences (and their context)
    evenly, each prefill chunk to the group with the fewest new tokens so far."""
    groups_seqs = [batch.decode_seqs // dp + (g < batch.decode_seqs % dp) for g in range(dp)]
    mean_context = batch.decode_context_tokens / batch.decode_seqs if batch.decode_seqs else 0.0
    chunks: list[list[tuple[int, int]]] = [[] for _ in range(dp)]
    load = [s * batch.tokens_per_decode_seq for s in groups_seqs]
    for new, cached in sorted(batch.chunks, reverse=True):
        g = min(range(dp), key=lambda i: (load[i], i))
        chunks[g].append((new, cached))
        load[g] += new
    return [GroupWork(s, s * mean_context, tuple(c)) for s, c in zip(groups_seqs, chunks)]


@attrs.frozen
class EngineStep:
    """`step_batch.StepCost` of one instance (``tp`` x ``dp`` devices, ``ep`` 1 or tp x dp) of ``arch``,
    from ``kernels``; `breakdown` says where a step's time went, kernel kind by kernel kind."""

    arch: ModelArch
    kernels: CompleteKernelCosts
    tp: int = 1
    dp: int = 1
    ep: int = 1
    weight_dtype: GemmDtype = "bfloat16"  # of the checkpoint's linear layers (fp8_block: R1, Qwen3-*-FP8)
    kv_dtype: KvDtype = "bfloat16"
    expert_imbalance: float = 1.0
    two_batch_overlap: bool = False
    cuda_graph_max_batch: int = 256  # per dp group
    launch_overhead_s_per_layer: float = 0.0
    step_overhead_s: float = 0.0
    overlap_scheduler: bool = False
    mtp_layers: int = 0
    gpus_per_node: int = 8  # an expert-parallel group (or a tp group) wider than a node spans nodes

    # steps priced so far, by their canonical batch (a simulation prices ~10^5 steps, a tune hundreds of
    # simulations; one composed step costs ~200 us of lookups)
    _memo: dict[StepBatch, float] = attrs.field(factory=dict, init=False, eq=False, repr=False)

    @property
    def _tp_nodes(self) -> int:
        return -(-self.tp // self.gpus_per_node)

    def batch_time_s(self, batch: StepBatch) -> float:
        """Wall time of the step: the slowest dp group's kernels, plus the step's overheads. Decode
        sequences are priced at their mean context rounded to 1/32 of its power of two (3% at most,
        what decode attention's time moves by), so that steps of one population share one price."""
        key = canonical_batch(batch)
        seconds = self._memo.get(key)
        if seconds is None:
            seconds = self._memo[key] = sum(self.breakdown(key).values())
        return seconds

    def breakdown(self, batch: StepBatch) -> dict[str, float]:
        """Seconds by kernel kind ("gemm", "gqa_context", "ep_dispatch", ..., "launch", "step": the
        scheduler's time the kernels do not hide) of the slowest dp group's step; they sum to `batch_time_s`
        ("two_batch_overlap", negative: the exchange time hidden under the other micro-batch's compute)."""
        if batch.num_tokens == 0:
            return {}
        # the groups step as one: a step with a prefill chunk anywhere runs eagerly, and DeepEP in its
        # normal mode, on every group (SGLang picks both for the global batch)
        decode_only = not batch.chunks
        groups = [self._group_times(work, batch.tokens_per_decode_seq, decode_only)
                  for work in split_over_groups(batch, self.dp)]
        slowest = max(groups, key=lambda times: sum(times.values()))
        # the scheduler's share of the wall: all of it, or with the overlap schedule what the kernels
        # do not cover
        scheduler_s = (max(0.0, self.step_overhead_s - sum(slowest.values())) if self.overlap_scheduler
                       else self.step_overhead_s)
        return dict(slowest) | ({"step": scheduler_s} if scheduler_s else {})

    # one dp group

    def _group_times(self, work: GroupWork, tokens_per_seq: int, decode_only: bool) -> Mapping[str, float]:
        times: defaultdict[str, float] = defaultdict(float)
        decode_tokens = work.decode_seqs * tokens_per_seq
        tokens = decode_tokens + sum(new for new, _ in work.chunks)
        if tokens == 0:
            return times
        graph = captured_batch(work.decode_seqs, self.cuda_graph_max_batch) if decode_only else None
        if graph is not None:  # a captured graph runs its padded batch
            decode_tokens, tokens = graph * tokens_per_seq, graph * tokens_per_seq
        seqs = (graph or work.decode_seqs) + len(work.chunks)
        a = self.arch
        self._cost(times, Elementwise("embedding", tokens, a.hidden_size))
        layer = self._layer_times(work, tokens, decode_tokens, graph or work.decode_seqs, tokens_per_seq, decode_only)
        dense_layers = a.first_k_dense if a.is_moe else a.num_layers
        for kind, seconds in layer["dense"].items():
            times[kind] += dense_layers * seconds
        for kind, seconds in layer["moe"].items():
            times[kind] += (a.num_layers - dense_layers) * seconds
        if self.mtp_layers and work.decode_seqs:  # the draft layer(s) over the decode tokens
            for kind, seconds in (layer["moe"] if a.is_moe else layer["dense"]).items():
                times[kind] += self.mtp_layers * seconds * decode_tokens / tokens
        self._cost(times, Elementwise("rmsnorm", seqs, a.hidden_size))
        self._cost(times, Gemm(seqs, -(-a.vocab_size // self.tp), a.hidden_size))
        if graph is None and self.launch_overhead_s_per_layer:
            times["launch"] += a.num_layers * self.launch_overhead_s_per_layer
        return times

    def _layer_times(self, work: GroupWork, tokens: int, decode_tokens: int, decode_seqs: int,
                     tokens_per_seq: int, decode_only: bool) -> dict[str, Mapping[str, float]]:
        """One layer's kernel times by kind: "dense" for a dense-MLP layer, "moe" for a MoE layer."""
        a = self.arch
        attention: defaultdict[str, float] = defaultdict(float)
        for _ in range(2):
            self._cost(attention, Elementwise("rmsnorm", tokens, a.hidden_size))
        for shape in self._projections(work, tokens, decode_tokens):
            self._cost(attention, shape)
        for new, cached in work.chunks:
            self._cost(attention, attention_shape(a, "context", self.tp, 1, new, cached, self.kv_dtype))
        if decode_seqs:
            context = round(work.decode_context_tokens / work.decode_seqs) if work.decode_seqs else 0
            self._cost(attention, attention_shape(a, "generation", self.tp, decode_seqs, tokens_per_seq, context,
                                                  self.kv_dtype))
        if self.tp > 1:
            self._cost(attention, AllReduce(self.tp, tokens * a.hidden_size, nodes=self._tp_nodes))
        dense = defaultdict(float, attention)
        for shape in (Gemm(tokens, 2 * -(-a.intermediate_size // self.tp), a.hidden_size, self.weight_dtype),
                      Gemm(tokens, a.hidden_size, -(-a.intermediate_size // self.tp), self.weight_dtype)):
            self._cost(dense, shape)
        self._cost(dense, Elementwise("activation", tokens, -(-a.intermediate_size // self.tp)))
        if self.tp > 1:
            self._cost(dense, AllReduce(self.tp, tokens * a.hidden_size, nodes=self._tp_nodes))
        moe: defaultdict[str, float] = defaultdict(float)
        if a.is_moe:
            for kind, seconds in (*attention.items(), *self._moe_times(tokens, decode_only).items()):
                moe[kind] += seconds
        return {"dense": dense, "moe": moe}

    def _projections(self, work: GroupWork, tokens: int, decode_tokens: int) -> list[Gemm]:
        a, tp, w = self.arch, self.tp, self.weight_dtype
        if a.attention != "mla":
            heads, kv_heads = max(1, a.num_attention_heads // tp), max(1, a.num_kv_heads // tp)
            return [Gemm(tokens, (heads + 2 * kv_heads) * a.head_dim, a.hidden_size, w),
                    Gemm(tokens, a.hidden_size, heads * a.head_dim, w)]
        heads = max(1, a.num_attention_heads // tp)
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        shapes = [Gemm(tokens, a.kv_lora_rank + a.qk_rope_head_dim, a.hidden_size, w)]  # kv_a, replicated
        if a.q_lora_rank:
            shapes += [Gemm(tokens, a.q_lora_rank, a.hidden_size, w), Gemm(tokens, heads * qk, a.q_lora_rank, w)]
        else:
            shapes.append(Gemm(tokens, heads * qk, a.hidden_size, w))
        attended = sum(new + cached for new, cached in work.chunks)
        if attended:  # prefill expands the latent of every token it attends to into K and V
            shapes.append(Gemm(attended, heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank, w))
        if decode_tokens:  # decode absorbs kv_b into q before attention and into o after
            shapes += [Gemm(decode_tokens, a.kv_lora_rank, a.qk_nope_head_dim, "bfloat16", batch=heads),
                       Gemm(decode_tokens, a.v_head_dim, a.kv_lora_rank, "bfloat16", batch=heads)]
        shapes.append(Gemm(tokens, a.hidden_size, heads * a.v_head_dim, w))
        return shapes

    def _moe_times(self, tokens: int, decode_only: bool) -> dict[str, float]:
        """A MoE layer after attention: router, shared experts, routed experts (and their exchange)."""
        a, tp, w = self.arch, self.tp, self.weight_dtype
        compute: defaultdict[str, float] = defaultdict(float)
        self._cost(compute, Gemm(tokens, a.num_experts, a.hidden_size))  # the router, in bfloat16
        if a.num_shared_experts:
            shared = -(-a.num_shared_experts * a.moe_intermediate_size // tp)
            self._cost(compute, Gemm(tokens, 2 * shared, a.hidden_size, w))
            self._cost(compute, Gemm(tokens, a.hidden_size, shared, w))
        if self.ep == 1:
            experts = MoeExperts(tokens, a.hidden_size, a.moe_intermediate_size, a.num_experts_per_tok, a.num_experts,
                                 moe_tp=tp, dtype=w, phase="generation" if decode_only else "context")
            self._cost(compute, experts, self.expert_imbalance)
            if tp > 1:
                self._cost(compute, AllReduce(tp, tokens * a.hidden_size, nodes=self._tp_nodes))
            return dict(compute)
        # expert parallel over every device of the instance: this device's tokens (its tp group's,
        # split over the group) go out to the experts' devices and come back
        per_rank = max(1, -(-tokens // tp))
        experts = MoeExperts(per_rank * self.ep, a.hidden_size, a.moe_intermediate_size, a.num_experts_per_tok,
                             a.num_experts, moe_ep=self.ep, dtype=w, phase="generation" if decode_only else "context",
                             deepep=True)
        self._cost(compute, experts, self.expert_imbalance)
        exchange: defaultdict[str, float] = defaultdict(float)
        mode: Literal["normal", "low_latency"] = "low_latency" if decode_only else "normal"
        phases: tuple[Literal["dispatch", "combine"], ...] = ("dispatch", "combine")
        for phase in phases:
            # DeepEP sends its dispatch in FP8 (SGLang's default) and combines in bfloat16
            self._cost(exchange, ExpertExchange(phase, mode, per_rank, a.hidden_size, a.num_experts_per_tok,
                                                a.num_experts, self.ep, nodes=-(-self.ep // self.gpus_per_node),
                                                dtype="fp8" if phase == "dispatch" else "bfloat16"))
        if not self.two_batch_overlap:
            return dict(compute) | dict(exchange)
        # two micro-batches: each one's exchange runs under the other's compute; what shows is the longer
        hidden = min(sum(compute.values()), sum(exchange.values()))
        return dict(compute) | dict(exchange) | {"two_batch_overlap": -hidden}

    def _cost(self, times: defaultdict[str, float], shape: Kernel, factor: float = 1.0) -> None:
        """Add ``shape``'s time (times ``factor``) under its kind."""
        k = self.kernels
        if isinstance(shape, Gemm):
            t = k.gemm(shape)
        elif isinstance(shape, Attention):
            t = k.attention(shape)
        elif isinstance(shape, MoeExperts):
            t = k.moe_experts(shape)
        elif isinstance(shape, Elementwise):
            t = k.elementwise(shape)
        else:
            t = k.collective(shape)
        times[shape.kind] += t.seconds * factor
