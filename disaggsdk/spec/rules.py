"""Rules that tie spec fields together: tp against the model's heads, instances against nodes.

Single values are checked when spec objects are built (`field_checks`); these rules need the
model's architecture and see the whole spec. All problems are collected, none is swallowed.
Each `Rule` declares the YAML keys it checks, so docs/spec.md can say which rule checks a key.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import attrs

from disaggsdk.errors import ModelError, SpecError
from disaggsdk.models import ModelArch, resolve_model
from disaggsdk.spec.field_checks import shown
from disaggsdk.spec.topology import MAX_INSTANCE_PAIRS, MAX_RANKS
from disaggsdk.spec.types import Spec


@attrs.frozen
class Rule:
    """One cross-field check and the YAML keys it reads.

    Attributes:
        keys: the YAML paths it checks (``$.decode.tp``); its problems name one of them.
        find: every problem of a spec, each "<yaml path>: <what to fix>"; the empty list when fine.
    """

    keys: tuple[str, ...]
    find: Callable[[Spec, ModelArch], list[str]]

    @property
    def name(self) -> str:
        return self.find.__name__

    @property
    def summary(self) -> str:
        """The first line of the rule's docstring: what it requires."""
        doc = inspect.getdoc(self.find)
        return doc.splitlines()[0] if doc else self.name


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def size_problems(spec: Spec) -> list[str]:
    """Why ``spec`` is too large to plan (`topology.MAX_RANKS` ranks, `topology.MAX_INSTANCE_PAIRS` instance
    pairs), each "<yaml path>: <what to fix>"; the empty list when it is not. Needs no model: the planner asks
    it before it places a rank."""
    p, d = spec.prefill, spec.decode
    at = "$.decode.replicas" if d.replicas * d.ranks_per_instance >= p.replicas * p.ranks_per_instance else \
        "$.prefill.replicas"
    problems = []
    ranks = p.replicas * p.ranks_per_instance + d.replicas * d.ranks_per_instance
    if ranks > MAX_RANKS:
        problems.append(f"{at}: {p.replicas:,} prefill x {p.ranks_per_instance:,} ranks + {d.replicas:,} decode x "
                        f"{d.ranks_per_instance:,} ranks (tp*dp) make {ranks:,} ranks; a plan places at most "
                        f"{MAX_RANKS:,} (8 x the largest shipped spec, so `plan` takes seconds): fewer replicas")
    pairs = p.replicas * d.replicas
    if pairs > MAX_INSTANCE_PAIRS:
        problems.append(f"{at}: {p.replicas:,} prefill x {d.replicas:,} decode instances make {pairs:,} pairs; a plan "
                        f"routes every pair and takes at most {MAX_INSTANCE_PAIRS:,} (128 x 128, 16 x 1,024), so `plan` "
                        f"takes seconds: fewer, larger instances (tp, dp)")
    return problems


def deployment_is_plannable(spec: Spec, arch: ModelArch) -> list[str]:
    """At most 4,096 ranks and 16,384 (prefill, decode) instance pairs: the plan places each rank and routes each
    pair."""
    return size_problems(spec)


def tp_divides_query_heads(spec: Spec, arch: ModelArch) -> list[str]:
    """`tp` divides the model's query heads, so every rank holds whole heads."""
    heads = arch.num_attention_heads
    return [
        f"$.{name}.tp: tp={role.tp} does not divide the {heads} query heads of {arch.name}; "
        f"use one of {', '.join(map(str, _divisors(heads)))}"
        for name, role in spec.roles.items()
        if heads % role.tp
    ]


def tp_splits_kv_heads(spec: Spec, arch: ModelArch) -> list[str]:
    """With GQA, `tp` divides or is a multiple of the KV heads, so they split or replicate evenly."""
    kv_heads = arch.num_kv_heads
    if arch.attention != "gqa":
        return []
    return [
        f"$.{name}.tp: tp={role.tp} neither divides nor is a multiple of the {kv_heads} KV heads "
        f"of {arch.name}, so KV heads cannot be split or replicated evenly; use a divisor or "
        f"multiple of {kv_heads}"
        for name, role in spec.roles.items()
        if kv_heads % role.tp and role.tp % kv_heads
    ]


def instance_fits_nodes(spec: Spec, arch: ModelArch) -> list[str]:
    """An instance's tp*dp ranks fit one node or span whole nodes."""
    per_node = spec.hardware.gpus_per_node
    problems = []
    for name, role in spec.roles.items():
        ranks = role.tp * role.dp
        if ranks > per_node and ranks % per_node:
            problems.append(
                f"$.{name}: an instance of tp*dp = {role.tp}*{role.dp} = {ranks} ranks does not fit a "
                f"node of {per_node} GPUs and does not span whole nodes; use at most {per_node} ranks "
                f"or a multiple of {per_node} ($.hardware.gpus_per_node)"
            )
    return problems


def ep_spans_the_instance(spec: Spec, arch: ModelArch) -> list[str]:
    """`ep` is 1 or every rank of the instance (`tp * dp`), and only a model with routed experts shards them."""
    problems = []
    for name, role in spec.roles.items():
        if role.ep == 1:
            continue
        if not arch.is_moe:
            problems.append(f"$.{name}.ep: {arch.name} has no routed experts to shard; remove ep (or set it to 1)")
        elif role.ep != role.tp * role.dp:
            problems.append(f"$.{name}.ep: ep={role.ep} must be 1 or the instance's tp*dp = {role.tp}*{role.dp} = "
                            f"{role.tp * role.dp} ranks (experts are partitioned over every rank of the instance); "
                            f"set {name}.ep: {role.tp * role.dp}")
    return problems


def device_matches_hardware(spec: Spec, arch: ModelArch) -> list[str]:
    """`device: cpu` goes with `$.hardware.gpu: cpu`, and `device: cuda` with a GPU kind."""
    if spec.device == "cuda" and spec.hardware.gpu == "cpu":
        return ["$.device: device 'cuda' on hardware.gpu 'cpu'; set $.device to 'cpu' or "
                "$.hardware.gpu to h100/h200"]
    if spec.device == "cpu" and spec.hardware.gpu != "cpu":
        return [f"$.hardware.gpu: {spec.hardware.gpu!r} with device 'cpu'; set $.hardware.gpu to "
                f"'cpu' (a CPU rank is one process) or $.device to 'cuda'"]
    return []


def rdma_needs_gpus(spec: Spec, arch: ModelArch) -> list[str]:
    """The RDMA providers (efa, verbs) are for GPU deployments; a CPU one uses shm or tcp."""
    if spec.transport.provider in ("efa", "verbs") and spec.device == "cpu":
        return [f"$.transport.provider: {spec.transport.provider!r} needs RDMA NICs; on a CPU "
                f"deployment use shm (one machine) or tcp"]
    return []


def verified_pages_are_host_memory(spec: Spec, arch: ModelArch) -> list[str]:
    """`$.transport.verify_pages` hashes KV pages on the host: GPU pools only through host mirrors."""
    if spec.transport.verify_pages and spec.device == "cuda" and spec.transport.kv_staging != "host":
        return ["$.transport.verify_pages: page digests are computed on the host and cannot read a "
                "CUDA KV pool; set it to false on device 'cuda', or stage KV through host mirrors "
                "($.transport.kv_staging: host)"]
    return []


def tcp_cannot_reach_gpu_memory(spec: Spec, arch: ModelArch) -> list[str]:
    """libfabric's tcp provider has no FI_HMEM: GPU pools cannot be registered with it directly."""
    if spec.device == "cuda" and spec.transport.provider == "tcp" and spec.transport.kv_staging == "direct":
        return ["$.transport.kv_staging: the tcp provider cannot register GPU memory; set it to host (or auto), "
                "or use a provider with FI_HMEM for CUDA (efa, verbs, shm)"]
    return []


def tiers_need_prefix_caching(spec: Spec, arch: ModelArch) -> list[str]:
    """KV tiers keep prefix-cache pages: without prefix caching nothing is cached to keep. A unit's
    tier copies the pages of its own process, so its ranks beyond the first (other processes) have none yet."""
    tiers = spec.kv.tiers
    if not tiers.enabled:
        return []
    if not spec.engine.prefix_caching:
        return ["$.kv.tiers: the tiers keep prefix-cache pages; set $.engine.prefix_caching: true, or turn the "
                "tiers off (host_gb: 0, disk_gb: 0, store: off)"]
    wide = [f"{name} tp={role.tp}" for name, role in (("prefill", spec.prefill), ("decode", spec.decode))
            if role.replicas and role.tp > 1]
    if wide:
        return [f"$.kv.tiers: tiers hold the pages of tp=1 units only for now ({', '.join(wide)}); use tp: 1 "
                f"or turn the tiers off"]
    return []


def speculation_fits_the_model(spec: Spec, arch: ModelArch) -> list[str]:
    """Speculative decoding: `mtp` needs a model with an MTP layer."""
    if spec.speculative.method == "mtp" and not arch.num_mtp_layers:
        return [f"$.speculative.method: {arch.name} has no MTP layer (num_nextn_predict_layers is 0); "
                f"use ngram, or a DeepSeek-V3-style model with its MTP weights"]
    return []


def address_needs_ray(spec: Spec, arch: ModelArch) -> list[str]:
    """A cluster address means nothing to the local backend: the spec meant Ray, or the address is stale."""
    if spec.launch.address and spec.launch.backend != "ray":
        return [f"$.launch.address: {shown(spec.launch.address)} is a Ray cluster address; set launch.backend: ray "
                f"or remove it"]
    return []


def cuda_devices_need_local_cuda(spec: Spec, arch: ModelArch) -> list[str]:
    """`launch.cuda_devices` maps GPUs of the local backend: a CPU spec has none, and Ray hands out its own."""
    if not spec.launch.cuda_devices:
        return []
    if spec.device != "cuda":
        return [f"$.launch.cuda_devices: {list(spec.launch.cuda_devices)} maps CUDA devices and this spec runs on "
                f"device: {spec.device}; remove it"]
    if spec.launch.backend != "local":
        return ["$.launch.cuda_devices: Ray gives each unit the GPUs it reserved (CUDA_VISIBLE_DEVICES); "
                "remove it, or use launch.backend: local"]
    return []


def max_model_len_within_the_model(spec: Spec, arch: ModelArch) -> list[str]:
    """`$.engine.max_model_len` is at most the model's context (`max_position_embeddings`)."""
    longest = arch.max_context_tokens
    if spec.engine.max_model_len is not None and longest is not None and spec.engine.max_model_len > longest:
        return [f"$.engine.max_model_len: {spec.engine.max_model_len:,} tokens exceed {arch.name}'s "
                f"{longest:,}-token context (max_position_embeddings); set at most {longest} or unset it"]
    return []


def role_change_problem(spec: Spec) -> str | None:
    """Why units of ``spec`` cannot change role (prefill <-> decode) live; None when they can: a unit keeps its
    ranks, pool and engine, so both roles must have one shape, and a lock-step expert-parallel group cannot
    leave its role alone."""
    p, d = spec.prefill, spec.decode
    if (p.tp, p.dp) != (d.tp, d.dp):
        return (f"prefill instances are tp={p.tp} dp={p.dp} and decode instances tp={d.tp} dp={d.dp}: a unit changes "
                "role only between instances of one shape; make them equal")
    if p.ep > 1 or d.ep > 1:
        return "expert-parallel instances (ep > 1) step as one group: their units cannot change role one by one"
    return None


def autoscale_needs_switchable_units(spec: Spec, arch: ModelArch) -> list[str]:
    """`serve.autoscale` moves units between roles: prefill and decode instances of one shape, minimums that fit."""
    a = spec.serve.autoscale
    if not a.enabled:
        return []
    problems = []
    why = role_change_problem(spec)
    if why is not None:
        problems.append(f"$.serve.autoscale.enabled: {why}")
    units = spec.prefill.replicas * spec.prefill.dp + spec.decode.replicas * spec.decode.dp
    if a.min_prefill + a.min_decode > units:
        problems.append(f"$.serve.autoscale.min_decode: min_prefill {a.min_prefill} + min_decode {a.min_decode} exceed "
                        f"the deployment's {units} prefill and decode units; lower them")
    return problems


def max_model_len(spec: Spec, arch: ModelArch) -> int | None:
    """The longest request (prompt + output, tokens) units of ``spec`` accept: `$.engine.max_model_len`, else the
    model's context; None when neither says."""
    return spec.engine.max_model_len or arch.max_context_tokens


# `model` is checked first, by resolving it: every other rule needs its architecture.
MODEL_KEYS = ("$.model",)
RULES: tuple[Rule, ...] = (
    Rule(("$.prefill.replicas", "$.decode.replicas", "$.prefill.tp", "$.prefill.dp", "$.decode.tp", "$.decode.dp"),
         deployment_is_plannable),
    Rule(("$.prefill.tp", "$.decode.tp"), tp_divides_query_heads),
    Rule(("$.prefill.tp", "$.decode.tp"), tp_splits_kv_heads),
    Rule(("$.prefill.tp", "$.prefill.dp", "$.decode.tp", "$.decode.dp", "$.hardware.gpus_per_node"),
         instance_fits_nodes),
    Rule(("$.prefill.ep", "$.decode.ep"), ep_spans_the_instance),
    Rule(("$.device", "$.hardware.gpu"), device_matches_hardware),
    Rule(("$.transport.provider", "$.device"), rdma_needs_gpus),
    Rule(("$.transport.verify_pages", "$.device", "$.transport.kv_staging"), verified_pages_are_host_memory),
    Rule(("$.transport.kv_staging", "$.transport.provider", "$.device"), tcp_cannot_reach_gpu_memory),
    Rule(("$.speculative.method",), speculation_fits_the_model),
    Rule(("$.kv.tiers", "$.engine.prefix_caching", "$.prefill.tp", "$.decode.tp"), tiers_need_prefix_caching),
    Rule(("$.launch.address", "$.launch.backend"), address_needs_ray),
    Rule(("$.engine.max_model_len",), max_model_len_within_the_model),
    Rule(("$.launch.cuda_devices", "$.device", "$.launch.backend"), cuda_devices_need_local_cuda),
    Rule(("$.serve.autoscale.enabled", "$.serve.autoscale.min_decode", "$.serve.autoscale.min_prefill"),
         autoscale_needs_switchable_units),
)


def spec_problems(spec: Spec, arch: ModelArch | None = None) -> list[str]:
    """Every cross-field problem of ``spec``, each as "<yaml path>: <what to fix>"."""
    if arch is None:
        try:
            arch = resolve_model(spec.model)
        except ModelError as exc:
            return [f"$.model: {exc}"]
    return [problem for rule in RULES for problem in rule.find(spec, arch)]


def check_spec(spec: Spec, arch: ModelArch | None = None) -> Spec:
    """Return ``spec`` unchanged when it is consistent.

    Raises:
        SpecError: listing every cross-field problem.
    """
    problems = spec_problems(spec, arch)
    if problems:
        raise SpecError(problems)
    return spec
