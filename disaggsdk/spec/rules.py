"""Rules that tie spec fields together: tp against the model's heads, instances against nodes.

Single values are checked when spec objects are built (`field_checks`); these rules need the
model's architecture and see the whole spec. All problems are collected, none is swallowed.
"""

from __future__ import annotations

from disaggsdk.errors import ModelError, SpecError
from disaggsdk.models import ModelArch, resolve_model
from disaggsdk.spec.types import Role, Spec


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _role_problems(role_name: str, role: Role, arch: ModelArch, spec: Spec) -> list[str]:
    problems = []
    path = f"$.{role_name}"
    heads = arch.num_attention_heads
    if heads % role.tp:
        problems.append(
            f"{path}.tp: tp={role.tp} does not divide the {heads} query heads of {arch.name}; "
            f"use one of {', '.join(map(str, _divisors(heads)))}"
        )
    kv_heads = arch.num_kv_heads
    if arch.attention == "gqa" and kv_heads % role.tp and role.tp % kv_heads:
        problems.append(
            f"{path}.tp: tp={role.tp} neither divides nor is a multiple of the {kv_heads} KV heads "
            f"of {arch.name}, so KV heads cannot be split or replicated evenly; use a divisor or "
            f"multiple of {kv_heads}"
        )
    ranks = role.tp * role.dp
    per_node = spec.hardware.gpus_per_node
    if ranks > per_node and ranks % per_node:
        problems.append(
            f"{path}: an instance of tp*dp = {role.tp}*{role.dp} = {ranks} ranks does not fit a "
            f"node of {per_node} GPUs and does not span whole nodes; use at most {per_node} ranks "
            f"or a multiple of {per_node} ($.hardware.gpus_per_node)"
        )
    return problems


def spec_problems(spec: Spec, arch: ModelArch | None = None) -> list[str]:
    """Every cross-field problem of ``spec``, each as "<yaml path>: <what to fix>"."""
    problems: list[str] = []
    if arch is None:
        try:
            arch = resolve_model(spec.model)
        except ModelError as exc:
            return [f"$.model: {exc}"]
    for role_name in ("prefill", "decode"):
        problems += _role_problems(role_name, getattr(spec, role_name), arch, spec)
    if spec.device == "cuda" and spec.hardware.gpu == "cpu":
        problems.append(
            "$.device: device 'cuda' on hardware.gpu 'cpu'; set $.device to 'cpu' or "
            "$.hardware.gpu to h100/h200"
        )
    if spec.device == "cpu" and spec.hardware.gpu != "cpu":
        problems.append(
            f"$.hardware.gpu: {spec.hardware.gpu!r} with device 'cpu'; set $.hardware.gpu to "
            f"'cpu' (a CPU rank is one process) or $.device to 'cuda'"
        )
    if spec.transport.provider in ("efa", "verbs") and spec.device == "cpu":
        problems.append(
            f"$.transport.provider: {spec.transport.provider!r} needs RDMA NICs; on a CPU "
            f"deployment use shm (one machine) or tcp"
        )
    return problems


def check_spec(spec: Spec, arch: ModelArch | None = None) -> Spec:
    """Return ``spec`` unchanged when it is consistent.

    Raises:
        SpecError: listing every cross-field problem.
    """
    problems = spec_problems(spec, arch)
    if problems:
        raise SpecError(problems)
    return spec
