"""The expert-parallel all-to-all of one engine step: the bytes and collectives the engine's scheme
issues, and the time the cost model charges for them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.models import ModelArch, dtype_bytes
from disaggsdk.sim.hardware import HardwareProfile

CALLS_PER_DISPATCH = 3  # split counts, hidden rows, local expert ids
CALLS_PER_COMBINE = 1
METADATA_ITEM_BYTES = 8  # split counts and local expert ids are int64


@attrs.frozen
class AllToAllTraffic:
    """One rank's expected expert-parallel exchange in one engine step (every MoE layer of it).

    The fields are those of `engine.expert_parallel.AllToAllCounters`, with its meaning: payload bytes
    are hidden-state rows sent to *other* ranks, ``local_bytes`` the rows copied on the rank (dispatch
    and combine), ``metadata_bytes`` the split counts and expert ids sent to other ranks. Expectations,
    hence floats; the call count is exact.
    """

    dispatch_payload_bytes: float
    combine_payload_bytes: float
    local_bytes: float
    metadata_bytes: float
    num_all_to_all_calls: int
    num_moe_layers: int  # MoE layers the step runs, MTP passes included: dispatches (and combines) a rank makes

    @property
    def payload_bytes(self) -> float:
        """Hidden-state bytes sent to other ranks, dispatch and combine together."""
        return self.dispatch_payload_bytes + self.combine_payload_bytes

    @property
    def sent_bytes(self) -> float:
        """Everything that leaves the rank: payload and metadata."""
        return self.payload_bytes + self.metadata_bytes


def check_expert_parallel(arch: ModelArch, tp: int, dp: int, ep: int) -> None:
    """The spec's rule for ``ep`` (`spec.rules.ep_spans_the_instance`), for a cost built without a spec.

    Raises:
        SpecError: ``ep`` is neither 1 nor ``tp * dp``, or ``ep > 1`` for a model without routed experts.
    """
    if ep != 1 and ep != tp * dp:
        raise SpecError(f"ep={ep} must be 1 or the instance's tp*dp = {tp}*{dp} = {tp * dp}; set ep to one of them")
    if ep > 1 and not arch.is_moe:
        raise SpecError(f"ep={ep}: {arch.name} has no routed experts to spread; use ep 1")


def all_to_all_bytes_per_step(arch: ModelArch, tp: int, dp: int, ep: int, num_tokens: float,
                              activation_dtype: str = "bfloat16", mtp_pass_tokens: Sequence[float] = (),
                              remote_fraction: float | None = None) -> AllToAllTraffic:
    """What one rank of an instance sends and copies in one step's dispatches and combines.

    Args:
        arch: the model (its MoE layers, hidden size, top-k, routed experts).
        tp: tensor-parallel ranks of a dp group.
        dp: data-parallel groups of the instance.
        ep: the instance's expert parallelism: 1 (experts tp-sliced, no all-to-all) or ``tp * dp``.
        num_tokens: tokens of the step over the whole instance (every dp group together), run through
            each of the model's MoE layers; a rank dispatches ``num_tokens / ep`` of them (the mean rank).
        activation_dtype: what the rows are sent in ("bfloat16" on GPUs, "float32" on the CPU engine).
        mtp_pass_tokens: the instance's tokens of each MTP pass of the step; a pass is one more MoE layer
            (DeepSeek's MTP layer).
        remote_fraction: the share of (token, slot) pairs whose expert is on another rank; None: uniform
            routing's ``(ep - 1) / ep``.
    Returns:
        The mean rank's expected traffic (all zero, no calls, when ``ep`` is 1).
    Raises:
        SpecError: ``ep`` is neither 1 nor ``tp * dp``, ``ep > 1`` for a model without routed experts,
            MTP passes for a model without an MTP layer, or a remote fraction outside [0, 1].
    """
    check_expert_parallel(arch, tp, dp, ep)
    if mtp_pass_tokens and not arch.num_mtp_layers:
        raise SpecError(f"mtp_pass_tokens: {arch.name} has no MTP layer; pass none")
    if remote_fraction is not None and not 0.0 <= remote_fraction <= 1.0:
        raise SpecError(f"remote_fraction must lie in [0, 1], got {remote_fraction}")
    moe_layers = arch.num_layers - arch.first_k_dense + len(mtp_pass_tokens)
    if ep == 1:
        return AllToAllTraffic(0.0, 0.0, 0.0, 0.0, 0, moe_layers)
    remote = (ep - 1) / ep if remote_fraction is None else remote_fraction
    tokens_through_moe = num_tokens * (arch.num_layers - arch.first_k_dense) + sum(mtp_pass_tokens)
    pairs = tokens_through_moe / ep * arch.num_experts_per_tok  # this rank's, over all MoE layers
    row_bytes = arch.hidden_size * dtype_bytes(activation_dtype)
    # combine sends back what this rank received from others; with balanced slices and uniform routing
    # that is, in expectation, as many rows as its dispatch sent out
    return AllToAllTraffic(
        dispatch_payload_bytes=pairs * remote * row_bytes,
        combine_payload_bytes=pairs * remote * row_bytes,
        local_bytes=2 * pairs * (1.0 - remote) * row_bytes,
        metadata_bytes=moe_layers * (ep - 1) * METADATA_ITEM_BYTES + pairs * remote * METADATA_ITEM_BYTES,
        num_all_to_all_calls=moe_layers * (CALLS_PER_DISPATCH + CALLS_PER_COMBINE),
        num_moe_layers=moe_layers,
    )


def wire_dtype(weight_dtype: str) -> str:
    """The dtype activations cross the wire in when matrices run in ``weight_dtype``: a block-FP8 model's
    activations are bfloat16 (its 16-bit dtype); otherwise the weights' own (float32 on the CPU engine)."""
    return "bfloat16" if weight_dtype == "fp8" else weight_dtype


def all_to_all_time_s(traffic: AllToAllTraffic, profile: HardwareProfile) -> float:
    """Seconds one step's exchange takes: the bytes a rank sends over its NVLink at the profile's
    achievable rate, plus the profile's latency for every collective (the module doc's assumptions)."""
    link_bytes_per_s = profile.nvlink_gb_per_s * 1e9 * profile.nvlink_efficiency
    return traffic.sent_bytes / link_bytes_per_s + traffic.num_all_to_all_calls * profile.allreduce_latency_us * 1e-6


def all_to_all_assumptions(profile: HardwareProfile, activation_dtype: str = "bfloat16") -> dict[str, object]:
    """The assumptions behind the all-to-all term of a run on ``profile``, for its output (JSON-ready;
    `sim.render.all_to_all_line` prints them)."""
    return {
        "routing": "uniform: (ep-1)/ep of the (token, expert) pairs leave their rank; dp groups balanced",
        "activation_dtype": activation_dtype,
        "dedup": "none: a token choosing k experts of one rank is sent k times",
        "link_gb_per_s": profile.nvlink_gb_per_s,
        "link_efficiency": profile.nvlink_efficiency,
        "latency_us_per_call": profile.allreduce_latency_us,
        "calls_per_moe_layer": CALLS_PER_DISPATCH + CALLS_PER_COMBINE,
        "overlap": "none: dispatch and combine are not overlapped with compute",
    }
