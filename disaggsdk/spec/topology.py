"""The spec's deployment shape: what one node offers (`Hardware`) and what each role's instances take (`Role`)."""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.field_checks import CheckedFields, choice, key, positive

GPU_KINDS = ("h100", "h200", "cpu")
# Memory of one GPU of each kind, GB (10^9 bytes), as the datasheets and disaggsdk/sim/profiles/*.yaml say
# (a test holds them equal): H100 SXM 80 GB HBM3, H200 141 GB HBM3e.
GPU_MEMORY_GB = {"h100": 80.0, "h200": 141.0}
# the spec's roles, by their YAML keys, in placement order
RoleName = Literal["prefill", "decode"]
ROLES: tuple[RoleName, ...] = ("prefill", "decode")


@attrs.frozen
class Hardware(CheckedFields):
    """What one node offers. On `gpu: cpu` a "gpu" is a CPU rank (one process)."""

    gpu: str = key("h200", "The accelerator of every node; `cpu` makes each rank one CPU process.", choice(GPU_KINDS))
    gpus_per_node: int = key(8,
        "GPUs (on `gpu: cpu`, rank processes) per node; an instance fits one node or spans whole nodes.", positive)
    nics_per_node: int = key(8, "RDMA NICs per node; KV pages leave a node through these.", positive)
    nic_gbps: float = key(400.0,
        "Line rate of one NIC in Gb/s; the planner and simulator time KV transfers with it.", positive)
    cpu_memory_gb: float = key(0.25,
        "On `gpu: cpu`, the memory one rank process may fill with weights, workspace and KV (what a GPU's memory is "
        "to a GPU rank; a GPU's comes from its kind). The default gives the tiny Qwen3-Coder ~1,280 KV pages of 16 "
        "tokens in float32, near the 1,024 a rank had before pools were sized from memory.", positive)


@attrs.frozen
class Role(CheckedFields):
    """One role (prefill or decode): `replicas` instances of `tp` x `dp` ranks each."""

    replicas: int = key(1, "Instances of this role.", positive)
    tp: int = key(1,
        "Tensor-parallel ranks of one dp group; they split the attention heads and the MLP/experts.", positive)
    dp: int = key(1,
        "Data-parallel attention ranks of one instance; each holds its own requests' KV and is a group of `tp` "
        "ranks.", positive)
    ep: int = key(1,
        "Expert parallelism: 1 (every rank holds a tp slice of every routed expert) or `tp * dp` (the routed experts "
        "partitioned over the instance's ranks, each expert whole on one rank, as vLLM's "
        "`--enable-expert-parallel`). Each MoE layer sends every token to the ranks of its experts and back "
        "(all-to-all); with `dp > 1` the dp ranks step in lock-step, an idle one with an empty batch. The plan counts "
        "only the experts a rank holds. Runs on CPU units (gloo all-to-all).", positive)

    @property
    def ranks_per_instance(self) -> int:
        return self.tp * self.dp
