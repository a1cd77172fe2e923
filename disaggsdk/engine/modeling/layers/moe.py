"""Mixture of experts: routers (Qwen3-MoE softmax top-k, DeepSeek-V3 group-limited sigmoid) and
the experts, placed one of two ways.

Tensor-parallel (``tp.experts`` None): each expert's intermediate dimension is split over the tp
ranks; every rank routes every token (the router is replicated) and runs its slice of each chosen
expert; the partial sums meet in the layer's one all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from disaggsdk.engine.modeling.layers import amx_linear
from disaggsdk.engine.modeling.layers.grouped_linear import grouped_linear
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.engine.weights import WeightSlot
from disaggsdk.errors import ModelError


class Experts(nn.Module):
    """``num_experts`` SwiGLU experts stored stacked, so one loop over the experts that received
    tokens does the work (not a loop over tokens)."""

    def __init__(self, prefix: str, num_experts: int, hidden_size: int, intermediate_size: int,
                 tp: TensorParallel, dtype: torch.dtype, optional_group: str | None = None):
        super().__init__()
        self.prefix = prefix
        self.num_experts = num_experts
        self.intermediate_size = intermediate_size
        self.tp = tp
        self.dispatcher = tp.experts
        if self.dispatcher is None:  # a tp slice of every expert
            self.held = (0, num_experts)
            self.rows = tp.shard(intermediate_size)
        else:  # whole experts, this rank's run of them
            self.held = self.dispatcher.expert_map.expert_range(self.dispatcher.ep_rank)
            self.rows = (0, intermediate_size)
        self.optional_group = optional_group
        local, held = self.rows[1] - self.rows[0], self.held[1] - self.held[0]
        self.w13 = nn.Parameter(torch.empty(held, 2 * local, hidden_size, dtype=dtype), requires_grad=False)
        # w13: [experts held, 2 * local intermediate (gate | up), hidden_size]
        self.w2 = nn.Parameter(torch.empty(held, hidden_size, local, dtype=dtype), requires_grad=False)
        # w2: [experts held, hidden_size, local intermediate]
        self.register_buffer("packed_w13", None, persistent=False)  # amx_linear.pack(w13), or None
        self.register_buffer("packed_w2", None, persistent=False)

    def forward(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        """Weighted sum of each token's experts (this rank's partial sum; see the module doc).

        The (token, expert) pairs are sorted by expert and each expert multiplies its rows in one
        grouped op (`grouped_linear`): no per-expert Python loop and no host sync, so a compiled
        step holds the whole layer. Under expert parallelism the call is collective over the
        expert-parallel group: every rank makes it, with no tokens too.

        Args:
            x: [num_tokens, hidden_size]
            topk_ids: [num_tokens, top_k], int64 expert ids
            topk_weights: [num_tokens, top_k], float32 routing weights
        Returns:
            [num_tokens, hidden_size]
        """
        if self.dispatcher is not None:
            return self._forward_expert_parallel(x, topk_ids, topk_weights)
        flat_ids = topk_ids.reshape(-1)
        order = torch.argsort(flat_ids, stable=True)
        token_of = order // topk_ids.shape[1]
        weight_of = topk_weights.reshape(-1)[order].to(x.dtype)
        h = self._run_sorted(x[token_of], flat_ids[order])
        # Pairs in expert order, tokens ascending within each: the same summation order as
        # transformers' per-expert loop, so float32 results match to the last bits where possible.
        return torch.zeros_like(x).index_add_(0, token_of, h * weight_of[:, None])

    def _run_sorted(self, rows: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
        """Each row through its (held) expert, unweighted; ``rows`` sorted by ``expert_of_row``,
        an index into the experts this rank holds."""
        if rows.shape[0] == 0:  # nothing routed here (under ep: maybe no expert held either)
            return rows.new_empty(0, self.w2.shape[1])
        experts = torch.arange(self.w13.shape[0], device=rows.device, dtype=expert_of_row.dtype)
        group_ends = torch.searchsorted(expert_of_row, experts, right=True)
        gate, up = grouped_linear(rows, self.w13, group_ends, self.packed_w13).chunk(2, dim=-1)
        return grouped_linear(F.silu(gate) * up, self.w2, group_ends, self.packed_w2)

    def _forward_expert_parallel(self, x: torch.Tensor, topk_ids: torch.Tensor,
                                 topk_weights: torch.Tensor) -> torch.Tensor:
        assert self.dispatcher is not None
        start, stop = self.tp.token_rows(x.shape[0])
        received = self.dispatcher.dispatch(x[start:stop], topk_ids[start:stop], topk_weights[start:stop])
        order = torch.argsort(received.local_expert_ids, stable=True)
        expert_out = torch.empty_like(received.hidden)
        expert_out[order] = self._run_sorted(received.hidden[order], received.local_expert_ids[order])
        mine = self.dispatcher.combine(expert_out, received.handle)
        if stop - start == x.shape[0]:
            return mine
        out = torch.zeros_like(x)  # the other tp ranks' shares arrive in the layer's all-reduce
        out[start:stop] = mine
        return out

    def pack_for_decode(self) -> int:
        """Keep the experts in the AMX kernel's layout too, where that kernel runs (amx_linear).
        Returns how many tensors were packed (0 or 2)."""
        self.packed_w13 = amx_linear.pack_if_useful(self.w13)
        self.packed_w2 = amx_linear.pack_if_useful(self.w2)
        return int(self.packed_w13 is not None) + int(self.packed_w2 is not None)

    def own_slots(self) -> Iterator[WeightSlot]:
        """The slots of the experts this rank holds (under ep, only those: the others' tensors are never read)."""
        full, local = self.intermediate_size, self.rows[1] - self.rows[0]
        hidden = self.w13.shape[2]
        shard = None if local == full else 0
        for i, e in enumerate(range(*self.held)):
            p = f"{self.prefix}{e}."
            yield WeightSlot(f"{p}gate_proj.weight", self.w13.data[i, :local], (full, hidden), shard, self.rows,
                             optional_group=self.optional_group)
            yield WeightSlot(f"{p}up_proj.weight", self.w13.data[i, local:], (full, hidden), shard, self.rows,
                             optional_group=self.optional_group)
            yield WeightSlot(f"{p}down_proj.weight", self.w2.data[i], (hidden, full), None if shard is None else 1,
                             self.rows, optional_group=self.optional_group)


class SoftmaxTopKRouter(nn.Module):
    """Qwen3-MoE: softmax over all experts, keep the top k, renormalise when norm_topk_prob."""

    def __init__(self, name: str, num_experts: int, hidden_size: int, top_k: int, norm_topk_prob: bool,
                 dtype: torch.dtype):
        super().__init__()
        self.name = name
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size, dtype=dtype), requires_grad=False)
        # weight: [num_experts, hidden_size]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_weights [T, k] float32, topk_ids [T, k] int64) for x [T, hidden_size]."""
        probs = torch.softmax(F.linear(x, self.weight), dim=-1, dtype=torch.float32)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        # transformers casts the weights to the model dtype before use
        return weights.to(x.dtype).float(), ids

    def own_slots(self) -> Iterator[WeightSlot]:
        yield WeightSlot(self.name, self.weight.data, tuple(self.weight.shape))


class GroupLimitedRouter(nn.Module):
    """DeepSeek-V3 'noaux_tc': sigmoid scores; choose experts by score + e_score_correction_bias
    among the ``topk_group`` groups whose two best biased scores sum highest; weight the chosen
    experts by their unbiased scores (renormalised when norm_topk_prob) times
    ``routed_scaling_factor``. Router weights stay float32 whatever the model dtype, as in
    transformers."""

    def __init__(self, prefix: str, config: dict[str, Any], hidden_size: int, optional_group: str | None = None):
        super().__init__()
        for field, want in (("topk_method", "noaux_tc"), ("scoring_func", "sigmoid")):
            if config.get(field, want) != want:
                raise ModelError(f"config.json field {field!r} is {config[field]!r}; the engine supports {want!r}")
        self.prefix = prefix
        self.optional_group = optional_group
        self.num_experts = config["n_routed_experts"]
        self.top_k = config["num_experts_per_tok"]
        self.num_groups = config.get("n_group") or 1
        self.topk_group = config.get("topk_group") or 1
        self.norm_topk_prob = config.get("norm_topk_prob", True)
        self.routed_scaling_factor = float(config.get("routed_scaling_factor", 1.0))
        self.weight = nn.Parameter(torch.empty(self.num_experts, hidden_size), requires_grad=False)
        # weight: [num_experts, hidden_size], float32
        self.e_score_correction_bias = nn.Parameter(torch.empty(self.num_experts), requires_grad=False)
        # e_score_correction_bias: [num_experts], float32

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_weights [T, k] float32, topk_ids [T, k] int64) for x [T, hidden_size]."""
        scores = F.linear(x.float(), self.weight).sigmoid()
        biased = scores + self.e_score_correction_bias
        per_group = self.num_experts // self.num_groups
        group_scores = biased.view(x.shape[0], self.num_groups, per_group).topk(2, dim=-1)[0].sum(dim=-1)
        group_ids = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_ids, 1.0)
        expert_mask = group_mask.unsqueeze(-1).expand(-1, -1, per_group).reshape(-1, self.num_experts)
        biased = biased.masked_fill(expert_mask == 0, float("-inf"))
        ids = torch.topk(biased, k=self.top_k, dim=-1, sorted=False)[1]
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * self.routed_scaling_factor, ids

    def own_slots(self) -> Iterator[WeightSlot]:
        g = self.optional_group
        yield WeightSlot(f"{self.prefix}weight", self.weight.data, tuple(self.weight.shape), optional_group=g)
        yield WeightSlot(f"{self.prefix}e_score_correction_bias", self.e_score_correction_bias.data,
                         (self.num_experts,), init="zeros", optional_group=g)


def held_experts_line(model: nn.Module) -> str | None:
    """What this rank's parameters hold of the routed experts under expert parallelism, in one
    line for its log ("ep rank 3 of 8 holds routed experts [3, 4) in 4 MoE layers: ..."); None
    without ep. Read from the modules' parameters and the checkpoint names they load, not from
    the plan, so a launch test can check what each rank really holds."""
    layers = [m for m in model.modules() if isinstance(m, Experts)]
    if not layers or layers[0].dispatcher is None:
        return None
    d = layers[0].dispatcher
    ids = sorted({int(slot.name.removeprefix(m.prefix).split(".")[0]) for m in layers for slot in m.own_slots()})
    rows = {m.w13.shape[0] for m in layers}
    nbytes = sum(p.numel() * p.element_size() for m in layers for p in (m.w13, m.w2))
    return (f"ep rank {d.ep_rank} of {d.expert_map.ep_size} holds routed experts {ids} in {len(layers)} MoE layers "
            f"({sorted(rows)} per layer, {nbytes:,} bytes of expert weights)")
