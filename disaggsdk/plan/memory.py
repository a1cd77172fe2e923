"""Memory per rank: weights by part, a workspace reserve, and the KV pool that is left (docs/memory.md).

For every rank of every instance::

    usable    = engine.memory_utilization x device memory      (vLLM's gpu_memory_utilization)
    kv pool   = usable - weights - workspace
    num_pages = kv pool // (page bytes of one layer x KV layers)   (an explicit engine.num_pages wins)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.models import ModelArch, dtype_bytes
from disaggsdk.models.catalog import CATALOG
from disaggsdk.models.checkpoint_tensors import ShardKind, WeightTotals, weight_totals
from disaggsdk.models.quantization import block_fp8_of
from disaggsdk.spec.field_checks import JsonValue
from disaggsdk.spec.rules import max_model_len
from disaggsdk.spec.topology import GPU_MEMORY_GB, RoleName
from disaggsdk.spec.types import Spec

GB = 10**9
# CUDA context and allocator slack (~0.5 GB), NCCL communicator buffers for tp/ep collectives (~1 GB), and the
# decode CUDA graphs vLLM captures (it logs 0.5-2 GiB for large models): an assumption, not a measurement.
GPU_FIXED_OVERHEAD_BYTES = 3 * GB
LOGIT_BYTES = 4  # float32 logits
CONTEXT_LENGTHS = (2048, 8192)  # the request lengths the plan counts concurrent requests at


def requests_key(context_tokens: int) -> str:
    """The JSON key of the concurrent requests at ``context_tokens`` (``requests_at_2k`` for 2,048)."""
    return f"requests_at_{context_tokens // 1024}k"


@attrs.frozen
class WeightBytes:
    """Bytes of weights one rank holds, by part (FP8 scales apart; the MTP layer whole, scales apart)."""

    attention: int = 0
    dense_mlp: int = 0
    moe_router: int = 0  # an MoE layer's router and its post-attention norm
    routed_experts: int = 0
    shared_experts: int = 0
    embeddings: int = 0  # embed_tokens, lm_head, the final norm
    mtp: int = 0  # DeepSeek's MTP layer (when the deployment drafts with it)
    fp8_scales: int = 0  # every weight_scale_inv the rank holds

    @property
    def total(self) -> int:
        """All of them."""
        return sum(attrs.astuple(self))

    def to_json(self) -> dict[str, JsonValue]:
        """The parts and their total, in bytes."""
        return {**attrs.asdict(self), "total": self.total}


def _local(numel: int, shard: ShardKind, tp: int, num_kv_heads: int, vocab_parallel: bool) -> int:
    """Elements a rank of a ``tp``-way group holds of ``numel`` elements sharded as ``shard`` (even splits)."""
    if shard == "replicated" or (shard == "vocab" and not vocab_parallel):
        return numel
    if shard == "kv_heads":
        return numel * max(1, num_kv_heads // tp) // num_kv_heads
    return numel // tp


def rank_weight_bytes(arch: ModelArch, tp: int, *, experts_held: int | None = None, dtype: str = "bfloat16",
                      keep_fp8: bool = True, vocab_parallel: bool = True, include_mtp: bool = False) -> WeightBytes:
    """The weights one rank holds.

    Args:
        arch: the model (its checkpoint inventory decides shapes and stored dtypes).
        tp: the rank's tensor-parallel group size.
        experts_held: routed experts the rank holds whole (expert parallelism); None: a tp slice of every one.
        dtype: the dtype 16/32-bit tensors are held in (``$.engine.dtype``).
        keep_fp8: FP8 weights stay FP8 with float32 scales (GPU); False: dequantized to ``dtype`` (CPU).
        vocab_parallel: embeddings and lm_head split by vocabulary over tp (vLLM) or whole (this engine).
        include_mtp: count DeepSeek's MTP layer (its embedding and head shared with the model's).
    Returns:
        Bytes by part.
    """
    totals: WeightTotals = weight_totals(arch)
    wide = dtype_bytes(dtype)
    per_storage = {"wide": wide, "fp8": 1 if keep_fp8 else wide, "scale": 4 if keep_fp8 else 0}
    parts: dict[str, int] = dict.fromkeys(attrs.fields_dict(WeightBytes), 0)
    for (group, part, shard, storage), numel in totals.numel.items():
        if group == "mtp" and (not include_mtp or (part == "embeddings" and shard == "vocab")):
            continue
        nbytes = _local(numel, shard, tp, arch.num_kv_heads, vocab_parallel) * per_storage[storage]
        parts["fp8_scales" if storage == "scale" else "mtp" if group == "mtp" else part] += nbytes
    for (group, storage), numel in totals.expert_numel.items():
        if group == "mtp" and not include_mtp:
            continue
        held = numel * experts_held if experts_held is not None else numel * arch.num_experts // tp
        parts["fp8_scales" if storage == "scale" else "mtp" if group == "mtp" else "routed_experts"] += (
            held * per_storage[storage])
    return WeightBytes(**parts)


def expert_range(num_experts: int, ep: int, ep_rank: int) -> tuple[int, int]:
    """The routed experts ``[start, stop)`` rank ``ep_rank`` of ``ep`` holds: contiguous, the first
    ``num_experts % ep`` ranks one more (vLLM's expert map)."""
    base, extra = divmod(num_experts, ep)
    start = ep_rank * base + min(ep_rank, extra)
    return start, start + base + (1 if ep_rank < extra else 0)


def workspace_bytes(arch: ModelArch, tp: int, ep: int, max_num_batched_tokens: int, max_num_seqs: int,
                    dtype: str, on_gpu: bool) -> int:
    """The reserve for one step's activations, its logits and (GPU) the fixed overhead (see the module doc)."""
    heads = arch.num_attention_heads // tp
    if arch.attention == "mla":
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        # q, the absorbed q_latent, the q/kv down projections and the attention output
        attn_width = heads * (qk + arch.kv_lora_rank + arch.v_head_dim) + arch.q_lora_rank + (
            arch.kv_lora_rank + arch.qk_rope_head_dim)
    else:
        attn_width = 2 * heads * arch.head_dim + 2 * max(1, arch.num_kv_heads // tp) * arch.head_dim
    mlp_width = arch.intermediate_size // tp
    if arch.is_moe:
        routed = arch.num_experts_per_tok * arch.moe_intermediate_size // (tp if ep == 1 else ep)
        mlp_width = max(mlp_width, routed + arch.num_shared_experts * arch.moe_intermediate_size // tp)
    per_token = (4 * arch.hidden_size + attn_width + 2 * mlp_width) * dtype_bytes(dtype)
    logits = max_num_seqs * arch.vocab_size * LOGIT_BYTES
    return max_num_batched_tokens * per_token + logits + (GPU_FIXED_OVERHEAD_BYTES if on_gpu else 0)


def device_memory_bytes(spec: Spec) -> int:
    """Memory of one rank's device: the GPU kind's, or on CPU ranks `$.hardware.cpu_memory_gb`."""
    if spec.device == "cpu" or spec.hardware.gpu == "cpu":
        return int(spec.hardware.cpu_memory_gb * GB)
    return int(GPU_MEMORY_GB[spec.hardware.gpu] * GB)


@attrs.frozen
class RankMemory:
    """One rank's memory: weights, workspace, KV pool and what the pool holds."""

    rank: int  # index in the instance (dp_rank * tp + tp_rank)
    device_bytes: int
    usable_bytes: int  # memory_utilization x device_bytes
    weights: WeightBytes
    workspace_bytes: int
    kv_bytes_per_token: int  # all KV layers of this rank
    page_size: int
    num_pages: int  # the pool's pages: engine.num_pages when set, else what the memory left holds (>= 0)
    num_pages_explicit: bool
    experts: tuple[int, int] | None  # routed experts held whole under ep; None: a tp slice of each (or none)

    @property
    def free_bytes(self) -> int:
        """What weights and workspace leave of the usable memory (negative: they do not fit)."""
        return self.usable_bytes - self.weights.total - self.workspace_bytes

    @property
    def kv_pool_bytes(self) -> int:
        """Bytes of the KV pool."""
        return self.num_pages * self.page_size * self.kv_bytes_per_token

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV the rank holds."""
        return self.num_pages * self.page_size

    def requests_at(self, context_tokens: int) -> int:
        """Requests of ``context_tokens`` (prompt + output) whose KV the pool holds at once."""
        return self.num_pages // math.ceil(context_tokens / self.page_size)

    def to_json(self) -> dict[str, JsonValue]:
        """The rank's figures in bytes and tokens (docs/plan-json.md)."""
        return {
            "rank": self.rank,
            "device_bytes": self.device_bytes,
            "usable_bytes": self.usable_bytes,
            "weights": self.weights.to_json(),
            "workspace_bytes": self.workspace_bytes,
            "kv_pool_bytes": self.kv_pool_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "num_pages": self.num_pages,
            "num_pages_explicit": self.num_pages_explicit,
            "kv_tokens": self.kv_tokens,
            "experts": None if self.experts is None else list(self.experts),
            **{requests_key(n): self.requests_at(n) for n in CONTEXT_LENGTHS},
        }


@attrs.frozen
class InstanceMemory:
    """The memory of every rank of one instance."""

    name: str
    role: RoleName
    tp: int
    dp: int
    ep: int
    ranks: tuple[RankMemory, ...]

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV the instance holds: each dp group holds its own requests (its tp ranks the same tokens)."""
        return self.dp * min(r.kv_tokens for r in self.ranks)

    def requests_at(self, context_tokens: int) -> int:
        """Requests of ``context_tokens`` the instance holds at once (each lives on one dp group)."""
        return self.dp * min(r.requests_at(context_tokens) for r in self.ranks)

    def to_json(self) -> dict[str, JsonValue]:
        """The instance's totals and its ranks (docs/plan-json.md)."""
        return {"ep": self.ep, "kv_tokens": self.kv_tokens,
                **{requests_key(n): self.requests_at(n) for n in CONTEXT_LENGTHS},
                "ranks": [r.to_json() for r in self.ranks]}


def kv_layers(spec: Spec, arch: ModelArch) -> int:
    """KV layers every rank keeps and every transfer moves: the model's, plus its MTP layer's when the
    deployment drafts with it (prefill fills that layer too, so decode never recomputes the prompt for it)."""
    return arch.num_layers + (arch.num_mtp_layers if spec.speculative.method == "mtp" else 0)


def kv_bytes_per_token_rank(spec: Spec, arch: ModelArch, tp: int) -> int:
    """KV bytes one token takes on one rank of a ``tp``-way group, all KV layers (`$.kv.dtype`; GQA heads split
    while tp <= KV heads, then replicated; the MLA latent replicated)."""
    return arch.kv_bytes_per_token_rank(tp, spec.kv.dtype) // arch.num_layers * kv_layers(spec, arch)


def role_ranks_memory(spec: Spec, arch: ModelArch, role: RoleName) -> tuple[RankMemory, ...]:
    """The memory of each rank of one instance of ``role`` (all instances of a role are alike)."""
    shape = spec.roles[role]
    kv_bytes_per_token = kv_bytes_per_token_rank(spec, arch, shape.tp)
    on_gpu = spec.device == "cuda"
    device = device_memory_bytes(spec)
    usable = int(spec.engine.memory_utilization * device)
    workspace = workspace_bytes(arch, shape.tp, shape.ep, spec.engine.max_num_batched_tokens,
                                spec.engine.max_num_seqs, spec.weight_dtype, on_gpu)
    include_mtp = spec.speculative.method == "mtp"
    by_held: dict[int | None, WeightBytes] = {}
    ranks = []
    for index in range(shape.tp * shape.dp):
        experts = expert_range(arch.num_experts, shape.ep, index) if shape.ep > 1 and arch.is_moe else None
        held = None if experts is None else experts[1] - experts[0]
        if held not in by_held:
            by_held[held] = rank_weight_bytes(arch, shape.tp, experts_held=held, dtype=spec.weight_dtype,
                                              keep_fp8=on_gpu, vocab_parallel=on_gpu, include_mtp=include_mtp)
        weights = by_held[held]
        explicit = spec.engine.num_pages is not None
        page_bytes_all_layers = spec.kv.page_size * kv_bytes_per_token
        free = usable - weights.total - workspace
        num_pages = spec.engine.num_pages if spec.engine.num_pages is not None else max(0, free // page_bytes_all_layers)
        ranks.append(RankMemory(index, device, usable, weights, workspace, kv_bytes_per_token, spec.kv.page_size,
                                num_pages, explicit, experts))
    return tuple(ranks)


def gb(nbytes: float) -> str:
    """Bytes as GB (10^9) with one decimal, e.g. ``"85.9"``."""
    return f"{nbytes / GB:.1f}"


def _device_words(spec: Spec) -> str:
    if spec.device == "cpu" or spec.hardware.gpu == "cpu":
        return f"{spec.engine.memory_utilization:g} x {spec.hardware.cpu_memory_gb:g} GB hardware.cpu_memory_gb"
    return f"{spec.engine.memory_utilization:g} x {GPU_MEMORY_GB[spec.hardware.gpu]:g} GB {spec.hardware.gpu}"


def _fixes(spec: Spec, arch: ModelArch, role: RoleName) -> list[str]:
    shape = spec.roles[role]
    fixes = []
    if arch.is_moe and shape.ep == 1 and shape.dp > 1:  # under plain tp, ep holds the same 1/tp of the experts
        fixes.append(f"shard experts with `$.{role}.ep: {shape.tp * shape.dp}`")
    if shape.dp == 1 and arch.num_attention_heads % (shape.tp * 2) == 0 and shape.tp * 2 <= spec.hardware.gpus_per_node:
        fixes.append(f"raise `$.{role}.tp` (to {shape.tp * 2})")
    elif shape.dp == 1 and shape.tp * 2 <= arch.num_attention_heads:
        fixes.append(f"raise `$.{role}.tp` across nodes (to {shape.tp * 2})")
    if spec.device == "cpu":
        fixes.append("raise `$.hardware.cpu_memory_gb`")
    elif spec.hardware.gpu == "h100":
        fixes.append("use `$.hardware.gpu: h200` (141 GB)")
    fp8 = f"{spec.model}-fp8"
    if fp8 in CATALOG and block_fp8_of(arch.hf_config, arch.name) is None:
        fixes.append(f"serve the FP8 checkpoint (`model: {fp8}`)")
    if spec.weight_dtype == "float32" and spec.device == "cuda":
        fixes.append("hold weights in `$.engine.dtype: bfloat16`")
    return fixes


def memory_problems(spec: Spec, arch: ModelArch, instances: Mapping[RoleName, tuple[RankMemory, ...]]) -> list[str]:
    """What does not fit, each "<yaml path>: <what, and the fix>", for the first rank of each role that fails.

    A rank does not fit when its weights and workspace exceed its usable memory, when a pool sized from memory
    cannot hold one request of the model's full context (``max_position_embeddings``, as vLLM's default
    ``max_model_len``), or when an explicit ``$.engine.num_pages`` needs more than the memory left.
    """
    problems = []
    for role, ranks in instances.items():
        for r in ranks:
            need = r.weights.total + r.workspace_bytes
            if r.free_bytes < r.page_size * r.kv_bytes_per_token:
                problems.append(
                    f"$.{role}: {role} rank {r.rank} needs {gb(r.weights.total)} GB of weights and "
                    f"{gb(r.workspace_bytes)} GB of workspace ({gb(need)} GB) and has {gb(r.usable_bytes)} GB "
                    f"({_device_words(spec)}), no room for KV: " + " or ".join(_fixes(spec, arch, role)))
                break
            if r.num_pages_explicit and r.kv_pool_bytes > r.free_bytes:
                problems.append(
                    f"$.engine.num_pages: {role} rank {r.rank}'s {r.num_pages} pages need {gb(r.kv_pool_bytes)} GB "
                    f"and its weights and workspace leave {gb(r.free_bytes)} GB ({_device_words(spec)}); lower "
                    f"engine.num_pages to {r.free_bytes // (r.page_size * r.kv_bytes_per_token)} or unset it, or "
                    f"raise the memory (" + " or ".join(_fixes(spec, arch, role) or ["engine.memory_utilization"])
                    + ")")
                break
            longest = max_model_len(spec, arch)
            if not r.num_pages_explicit and longest and r.kv_tokens < longest:
                whose = ("engine.max_model_len" if spec.engine.max_model_len
                         else f"{arch.name}'s context, max_position_embeddings")
                cap = [f"cap requests with `$.engine.max_model_len: {r.kv_tokens // 1024 * 1024}`"] if r.kv_tokens >= 1024 else []
                problems.append(
                    f"$.{role}: {role} rank {r.rank}'s KV pool holds {r.kv_tokens:,} tokens "
                    f"({gb(r.kv_pool_bytes)} GB), less than one request of {longest:,} tokens ({whose}); "
                    + " or ".join(cap + ["raise engine.memory_utilization"] + _fixes(spec, arch, role)))
                break
    return problems


def spec_memory(spec: Spec, arch: ModelArch) -> dict[RoleName, tuple[RankMemory, ...]]:
    """The ranks' memory of one instance of each role, prefill first."""
    return {role: role_ranks_memory(spec, arch, role) for role in spec.roles}


def spec_memory_problems(spec: Spec, arch: ModelArch | None = None) -> list[str]:
    """`memory_problems` of ``spec``: what `disaggsdk validate`, `launch` and `tune` refuse.

    Raises:
        ModelError: ``spec.model`` cannot be resolved (when ``arch`` is None).
    """
    if arch is None:
        from disaggsdk.models import resolve_model

        arch = resolve_model(spec.model)
    return memory_problems(spec, arch, spec_memory(spec, arch))


def check_memory(spec: Spec, arch: ModelArch | None = None) -> None:
    """Refuse a spec whose ranks do not fit their memory.

    Raises:
        SpecError: every memory problem, each with its YAML path and the fix.
    """
    problems = spec_memory_problems(spec, arch)
    if problems:
        raise SpecError(problems)


def num_pages_per_rank(spec: Spec, role: RoleName, arch: ModelArch | None = None) -> int:
    """KV pages of each rank of ``role``: ``$.engine.num_pages`` when set, else what the memory plan leaves.

    The one place a unit, the router and the simulator learn the pool size (all ranks of a role get the fewest
    any of them can hold, so a dp group's ranks agree).

    Raises:
        SpecError: the memory plan leaves no page (the message says what to change).
        ModelError: ``spec.model`` cannot be resolved (when ``arch`` is None).
    """
    if spec.engine.num_pages is not None:
        return spec.engine.num_pages
    if arch is None:
        from disaggsdk.models import resolve_model

        arch = resolve_model(spec.model)
    ranks = role_ranks_memory(spec, arch, role)
    pages = min(r.num_pages for r in ranks)
    if pages < 1:
        raise SpecError(memory_problems(spec, arch, {role: ranks}) or [
            f"$.{role}: its ranks' memory leaves no KV page; set engine.num_pages or give them more memory"])
    return pages
