"""Kernel times from a hardware profile's datasheet rates: the cost model's formulas, one kernel at a time."""

from __future__ import annotations

import attrs

from disaggsdk.models import dtype_bytes
from disaggsdk.sim.all_to_all import CALLS_PER_COMBINE, CALLS_PER_DISPATCH, METADATA_ITEM_BYTES
from disaggsdk.sim.cost_model import ACTIVATION_BYTES
from disaggsdk.sim.hardware import HardwareProfile
from disaggsdk.sim.kernels import (
    AllReduce,
    Attention,
    Collective,
    Elementwise,
    ExpertExchange,
    Gemm,
    GemmDtype,
    KernelTime,
    MoeExperts,
)

_WEIGHT_BYTES: dict[GemmDtype, int] = {"bfloat16": 2, "fp8": 1, "fp8_block": 1}
# bytes an elementwise kernel moves per element of its width: embedding reads a row and writes it;
# rmsnorm with its fused residual add reads input and residual and writes both; SiLU-and-mul reads
# gate and up and writes their product
_ELEMENTWISE_PASSES = {"embedding": 2, "rmsnorm": 4, "activation": 3}


@attrs.frozen
class RooflineKernels:
    """`kernels.KernelCosts` from ``profile``'s rates; answers every shape (``fit`` "roofline")."""

    profile: HardwareProfile

    @property
    def source(self) -> str:
        return f"roofline (profile {self.profile.name})"

    def _time(self, flops: float, bytes_moved: float, matrix_dtype: str) -> KernelTime:
        p = self.profile
        flops_rate = p.tflops(matrix_dtype) * 1e12 * p.flops_efficiency
        bytes_rate = p.hbm_gb_per_s * 1e9 * p.bandwidth_efficiency
        return KernelTime(max(flops / flops_rate, bytes_moved / bytes_rate), self.source, "roofline")

    def gemm(self, shape: Gemm) -> KernelTime:
        """``batch x [m, k] @ [k, n]``: weights in their dtype, activations in (quantized like the weights) and out (bfloat16)."""
        wb = _WEIGHT_BYTES[shape.dtype]
        flops = 2.0 * shape.batch * shape.m * shape.n * shape.k
        bytes_moved = shape.batch * (shape.n * shape.k * wb + shape.m * shape.k * wb + shape.m * shape.n * ACTIVATION_BYTES)
        return self._time(flops, bytes_moved, "bfloat16" if shape.dtype == "bfloat16" else "fp8")

    def attention(self, shape: Attention) -> KernelTime:
        """Scores and weighted sums over every (query, attended position) pair; the KV read once per sequence."""
        kvb = dtype_bytes(shape.kv_dtype)
        kv_tokens = shape.batch * (shape.cached_tokens + shape.new_tokens)
        if shape.attention == "mla" and shape.phase == "generation":
            flops_per_pair = 2 * shape.num_heads * (2 * shape.kv_lora_rank + shape.qk_rope_head_dim)
            bytes_per_kv_token = (shape.kv_lora_rank + shape.qk_rope_head_dim) * kvb
        elif shape.attention == "mla":
            flops_per_pair = 2 * shape.num_heads * (shape.head_dim + shape.v_head_dim)
            bytes_per_kv_token = shape.num_heads * (shape.head_dim + shape.v_head_dim) * ACTIVATION_BYTES
        else:
            flops_per_pair = 2 * shape.num_heads * (shape.head_dim + shape.v_head_dim)
            bytes_per_kv_token = shape.num_kv_heads * (shape.head_dim + shape.v_head_dim) * kvb
        return self._time(float(flops_per_pair) * shape.context_pairs, float(bytes_per_kv_token) * kv_tokens, "bfloat16")

    def moe_experts(self, shape: MoeExperts) -> KernelTime:
        """This device's share of the routed experts' gate_up and down products, and of the distinct experts' weights."""
        devices = shape.moe_tp * shape.moe_ep
        expert_params = 3.0 * shape.hidden_size * shape.inter_size
        flops = 2.0 * shape.num_tokens * shape.topk * expert_params / devices
        e, k = shape.num_experts, min(shape.topk, shape.num_experts)
        distinct = e * (1.0 - (1.0 - k / e) ** shape.num_tokens)
        bytes_moved = distinct * expert_params * _WEIGHT_BYTES[shape.dtype] / devices
        return self._time(flops, bytes_moved, "bfloat16" if shape.dtype == "bfloat16" else "fp8")

    def collective(self, shape: Collective) -> KernelTime:
        """An all-reduce as a ring (``2 (r-1)/r`` of the tensor over the link), or one DeepEP dispatch or
        combine as `all_to_all` charges it (uniform routing, no dedup, metadata with the dispatch), plus
        the profile's latency for each collective call."""
        p = self.profile
        nvlink = p.nvlink_gb_per_s * 1e9 * p.nvlink_efficiency
        ranks_per_node = -(-shape.ranks // shape.nodes)
        nic_share = p.nic_bytes_per_s * p.nics_per_node / ranks_per_node  # this rank's share of its node's NICs
        latency_s = p.allreduce_latency_us * 1e-6
        if isinstance(shape, AllReduce):
            size = shape.elements * (1 if shape.dtype == "fp8" else ACTIVATION_BYTES)
            link = nvlink if shape.nodes == 1 else min(nvlink, nic_share)
            return KernelTime(2 * (shape.ranks - 1) / shape.ranks * size / link + latency_s, self.source, "roofline")
        return KernelTime(self._exchange_s(shape, nvlink, nic_share, latency_s), self.source, "roofline")

    @staticmethod
    def _exchange_s(shape: ExpertExchange, nvlink: float, nic_share: float, latency_s: float) -> float:
        ranks_per_node = min(shape.ranks, -(-shape.ranks // shape.nodes))
        pairs = float(shape.tokens * shape.topk)
        share_on_node = (ranks_per_node - 1) / shape.ranks  # pairs bound for another rank of this node
        share_off_node = (shape.ranks - ranks_per_node) / shape.ranks  # ... for a rank of another node
        row_bytes = shape.hidden_size * (1 if shape.dtype == "fp8" else ACTIVATION_BYTES)
        on_node = pairs * share_on_node * row_bytes
        off_node = pairs * share_off_node * row_bytes
        calls = CALLS_PER_COMBINE
        if shape.phase == "dispatch":  # split counts to every peer and each row's local expert id
            on_node += (ranks_per_node - 1) * METADATA_ITEM_BYTES + pairs * share_on_node * METADATA_ITEM_BYTES
            off_node += (shape.ranks - ranks_per_node) * METADATA_ITEM_BYTES + pairs * share_off_node * METADATA_ITEM_BYTES
            calls = CALLS_PER_DISPATCH
        return on_node / nvlink + off_node / nic_share + calls * latency_s

    def elementwise(self, shape: Elementwise) -> KernelTime:
        """Bytes over bandwidth (`_ELEMENTWISE_PASSES` says what each op reads and writes)."""
        bytes_moved = float(_ELEMENTWISE_PASSES[shape.op]) * shape.tokens * shape.width * dtype_bytes(shape.dtype)
        return self._time(0.0, bytes_moved, "bfloat16")
