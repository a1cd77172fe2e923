"""First-principles time of one engine step, and of moving one request's KV.

Per layer, a device's time is the larger of its FLOPs over its achievable rate and the bytes it
touches over its achievable memory bandwidth — weights (for MoE only the distinct experts the
batch hits), KV read by attention — plus tensor-parallel all-reduces over NVLink, the expert
all-to-all when the instance spreads its experts (``ep > 1``), plus fixed per-layer and per-step
overheads. Every constant comes from the `HardwareProfile`; nothing here is tuned to a target number.
"""

from __future__ import annotations

import math

import attrs

from disaggsdk.models import ModelArch, dtype_bytes
from disaggsdk.plan.memory import GB, rank_weight_bytes, workspace_bytes
from disaggsdk.sim.all_to_all import (
    AllToAllTraffic,
    all_to_all_bytes_per_step,
    all_to_all_time_s,
    check_expert_parallel,
    wire_dtype,
)
from disaggsdk.sim.hardware import HardwareProfile
from disaggsdk.sim.step_batch import StepBatch
from disaggsdk.spec.engine_settings import EngineSettings

ACTIVATION_BYTES = 2  # bf16 activations on the wire (all-reduce; the all-to-all sends the 16-bit dtype)
_ENGINE = EngineSettings()  # a cost model without a spec sizes memory with the spec's defaults


def _attention_params(arch: ModelArch) -> tuple[float, float]:
    """(params split by tp, params replicated on every rank) of one attention block."""
    h = arch.hidden_size
    if arch.attention == "mla":
        heads = arch.num_attention_heads
        q_b = (arch.q_lora_rank or h) * heads * (arch.qk_nope_head_dim + arch.qk_rope_head_dim)
        kv_b = arch.kv_lora_rank * heads * (arch.qk_nope_head_dim + arch.v_head_dim)
        o = heads * arch.v_head_dim * h
        replicated = h * (arch.q_lora_rank or 0) + h * (arch.kv_lora_rank + arch.qk_rope_head_dim)
        return q_b + kv_b + o, replicated
    q = h * arch.num_attention_heads * arch.head_dim
    kv = 2 * h * arch.num_kv_heads * arch.head_dim
    return 2 * q + kv, 0.0


def _attention_flops_per_context_token(arch: ModelArch) -> float:
    """FLOPs of scores + weighted sum, per (query token, context token) pair, all heads."""
    heads = arch.num_attention_heads
    if arch.attention == "mla":  # absorbed form, as decode kernels run it
        return 2 * heads * (2 * arch.kv_lora_rank + arch.qk_rope_head_dim)
    return 2 * heads * 2 * arch.head_dim


@attrs.frozen
class StepCostModel:
    """Step times of one instance (tp x dp devices) of ``arch`` on ``profile``.

    ``ep`` is the spec's: 1 (each dp group holds every expert, tp-sliced; no all-to-all) or ``tp * dp``
    (each device holds 1/ep of the routed experts, exchanged by all-to-all). Other values raise SpecError.
    """

    arch: ModelArch
    profile: HardwareProfile
    tp: int = 1
    dp: int = 1
    ep: int = 1
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"

    @property
    def devices(self) -> int:
        return self.tp * self.dp

    @property
    def _flops_rate(self) -> float:
        return self.profile.tflops(self.weight_dtype) * 1e12 * self.profile.flops_efficiency

    @property
    def _bytes_rate(self) -> float:
        return self.profile.hbm_gb_per_s * 1e9 * self.profile.bandwidth_efficiency

    def _expert_bytes(self) -> float:
        a = self.arch
        return 3 * a.hidden_size * a.moe_intermediate_size * dtype_bytes(self.weight_dtype)

    def distinct_experts(self, num_tokens: float) -> float:
        """Expected number of distinct routed experts one MoE layer touches for a batch."""
        a = self.arch
        if not a.is_moe or num_tokens <= 0:
            return 0.0
        return a.num_experts * (1.0 - (1.0 - a.num_experts_per_tok / a.num_experts) ** num_tokens)

    def __attrs_post_init__(self) -> None:
        check_expert_parallel(self.arch, self.tp, self.dp, self.ep)

    @property
    def _unquantized_dtype(self) -> str:
        # an FP8 checkpoint's 16-bit tensors (norms, embeddings, router) and its activations are bfloat16
        return "bfloat16" if self.weight_dtype == "fp8" else self.weight_dtype

    def weight_bytes_per_device(self) -> int:
        """Resident weights of one device, by the plan's memory model (`disaggsdk.plan.memory`): the checkpoint's
        tensors as a GPU rank holds them (block-FP8 ones as stored when ``weight_dtype`` is fp8, the rest in
        bfloat16 then), embeddings split by vocabulary, the routed experts split over the devices under dp."""
        held = -(-self.arch.num_experts // self.ep) if self.ep > 1 else None
        return rank_weight_bytes(self.arch, self.tp, experts_held=held, dtype=self._unquantized_dtype,
                                 keep_fp8=self.weight_dtype == "fp8", vocab_parallel=True).total

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV the instance can hold (all dp groups together), by the plan's memory model with the spec's
        default engine settings: `memory_utilization` of the profile's memory less weights and workspace. A
        simulation of a spec takes its plan's figure instead (`Plan.memory`)."""
        workspace = workspace_bytes(self.arch, self.tp, self.ep, _ENGINE.max_num_batched_tokens,
                                    _ENGINE.max_num_seqs, self._unquantized_dtype, on_gpu=True)
        free = _ENGINE.memory_utilization * self.profile.memory_gb * GB - self.weight_bytes_per_device() - workspace
        per_token = self.arch.kv_bytes_per_token_rank(self.tp, self.kv_dtype)
        return max(0, int(free / per_token)) * self.dp

    def _allreduce_s(self, num_tokens: float) -> float:
        if self.tp == 1:
            return 0.0
        size = num_tokens / self.dp * self.arch.hidden_size * ACTIVATION_BYTES
        link = self.profile.nvlink_gb_per_s * 1e9 * self.profile.nvlink_efficiency
        return 2 * (self.tp - 1) / self.tp * size / link + self.profile.allreduce_latency_us * 1e-6

    def all_to_all_per_step(self, num_tokens: float) -> AllToAllTraffic:
        """One device's expected expert all-to-all in a step of ``num_tokens`` (the instance's), sent in
        the activations' dtype (`disaggsdk.sim.all_to_all.all_to_all_bytes_per_step`)."""
        return all_to_all_bytes_per_step(self.arch, self.tp, self.dp, self.ep, num_tokens,
                                         activation_dtype=wire_dtype(self.weight_dtype))

    def _all_to_all_s(self, num_tokens: float) -> float:
        """The step's all-to-all time, every MoE layer together."""
        if self.ep == 1:
            return 0.0
        return all_to_all_time_s(self.all_to_all_per_step(num_tokens), self.profile)

    def batch_time_s(self, batch: StepBatch) -> float:
        """`step_batch.StepCost`: `step_time_s` of the batch's totals."""
        return self.step_time_s(batch.num_tokens, batch.num_sequences, batch.context_pairs, batch.kv_read_tokens)

    def step_time_s(self, num_tokens: int, num_sequences: int, context_pairs: float, kv_read_tokens: float) -> float:
        """Wall time of one forward step of the whole instance.

        Args:
            num_tokens: new tokens in the step (decode tokens + prefill chunk tokens).
            num_sequences: requests in the step (one logits row each).
            context_pairs: sum over new tokens of the context each attends to (a decode token
                at length L adds L; a prefill chunk of c tokens after p cached adds c*p + c*(c+1)/2).
            kv_read_tokens: tokens of KV read from memory (a decode token at length L reads L).
        Returns:
            seconds.
        """
        if num_tokens <= 0:
            return 0.0
        a, p, wb = self.arch, self.profile, dtype_bytes(self.weight_dtype)
        split, repl = _attention_params(a)
        attn_flops = 2 * num_tokens * (split + repl) + _attention_flops_per_context_token(a) * context_pairs
        attn_bytes = (split / self.tp + repl) * wb + kv_read_tokens * a.kv_bytes_per_token_layer(self.kv_dtype) * (
            1.0 if a.attention == "mla" else 1.0 / min(self.tp, a.num_kv_heads)) / self.dp
        attn_s = max(attn_flops / self.devices / self._flops_rate, attn_bytes / self._bytes_rate)

        dense_layers = a.first_k_dense if a.is_moe else a.num_layers
        dense_params = 3 * a.hidden_size * a.intermediate_size
        dense_s = max(2 * num_tokens * dense_params / self.devices / self._flops_rate,
                      dense_params / self.tp * wb / self._bytes_rate)
        moe_s = 0.0
        if a.is_moe:
            active = a.num_experts_per_tok + a.num_shared_experts
            moe_flops = 2 * num_tokens * active * self._expert_bytes() / wb
            moe_bytes = (self.distinct_experts(num_tokens) * self._expert_bytes() / self.devices
                         + a.num_shared_experts * self._expert_bytes() / self.tp)
            moe_s = max(moe_flops / self.devices / self._flops_rate, moe_bytes / self._bytes_rate)

        per_layer_fixed = 2 * self._allreduce_s(num_tokens) + p.kernel_overhead_us_per_layer * 1e-6
        layers_s = (a.num_layers * (attn_s + per_layer_fixed) + dense_layers * dense_s
                    + (a.num_layers - dense_layers) * moe_s + self._all_to_all_s(num_tokens))
        head_flops = 2 * num_sequences * a.hidden_size * a.vocab_size
        head_s = max(head_flops / self.devices / self._flops_rate, a.hidden_size * a.vocab_size / self.tp * wb / self._bytes_rate)
        return layers_s + head_s + p.step_overhead_ms * 1e-3


def prefill_context_pairs(chunk_tokens: int, cached_tokens: int) -> float:
    """Sum of attended context lengths over a causal prefill chunk (see `step_time_s`)."""
    return chunk_tokens * cached_tokens + chunk_tokens * (chunk_tokens + 1) / 2


@attrs.frozen
class TransferCostModel:
    """Time to move one request's KV from a prefill to a decode instance over RDMA NICs."""

    profile: HardwareProfile
    bytes_per_token: float  # bytes the route moves per token, all source ranks together
    writes_per_page: float  # writes per page (all layers, all transfers of the route)
    page_size: int
    num_layers: int
    num_nics: int  # NICs the route's source ranks use at once

    def total_s(self, num_tokens: int) -> float:
        """Moving the whole KV of ``num_tokens`` after the forward pass (no streaming)."""
        pages = math.ceil(max(0, num_tokens) / self.page_size)
        data_s = num_tokens * self.bytes_per_token / (self.num_nics * self.profile.nic_bytes_per_s)
        writes_s = pages * self.writes_per_page / self.num_nics * self.profile.transfer_write_overhead_us * 1e-6
        return data_s + writes_s

    def exposed_s(self, num_tokens: int, streaming: bool) -> float:
        """Transfer time left after the forward pass ends: one layer's share when streaming."""
        total = self.total_s(num_tokens)
        return total / self.num_layers if streaming else total


def transfer_cost_from_route(route, profile: HardwareProfile, layout: str, page_size: int) -> TransferCostModel:
    """The transfer cost of one planner `Route` (bytes and writes exactly as the routes move them).

    Args:
        route: a `disaggsdk.plan.routes.Route`.
        profile: the node's NICs.
        layout: "HND" or "NHD".
        page_size: tokens per page.
    """
    runs = [t.page_runs(layout) for t in route.transfers_for(0)]
    bytes_per_page_layer = sum(r.count * r.length_bytes for r in runs)
    sources = {t.src_tp_rank for t in route.transfers_for(0)}
    return TransferCostModel(
        profile=profile,
        bytes_per_token=bytes_per_page_layer * route.num_layers / page_size,
        writes_per_page=sum(r.count for r in runs) * route.num_layers,
        page_size=page_size,
        num_layers=route.num_layers,
        num_nics=max(1, min(len(sources), profile.nics_per_node)),
    )
