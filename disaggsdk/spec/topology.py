"""The spec's deployment shape: what one node offers (`Hardware`) and what each role's instances take (`Role`)."""

from __future__ import annotations

from typing import Literal

import attrs

from disaggsdk.spec.field_checks import CheckedFields, choice, count, key, positive_up_to

GPU_KINDS = ("h100", "h200", "cpu")
# Memory of one GPU of each kind, GB (10^9 bytes), as the datasheets and disaggsdk/sim/profiles/*.yaml say
# (a test holds them equal): H100 SXM 80 GB HBM3, H200 141 GB HBM3e.
GPU_MEMORY_GB = {"h100": 80.0, "h200": 141.0}
# the spec's roles, by their YAML keys, in placement order
RoleName = Literal["prefill", "decode"]
ROLES: tuple[RoleName, ...] = ("prefill", "decode")

# How large a deployment a spec may describe. A plan places every rank and routes every prefill instance to
# every decode instance, and `disaggsdk plan` prints each rank and route: within these bounds it takes seconds
# (under 20 s on 2 busy cores at the worst, 128 x 128 instances of 16 ranks); 100,000 decode replicas took
# minutes and a replica count of 10^23 never ended. 4,096 ranks (GPUs, or CPU rank processes) is 8 times the
# largest shipped spec (specs/r1_64_nodes.yaml: 512 H200s, 16 x 48 instances), so nodes are at most 4,096 too.
MAX_RANKS = 4096
MAX_INSTANCE_PAIRS = 16_384  # prefill instances x decode instances: 128 x 128, 16 x 1,024
RANKS_WHY = "a plan places at most 4,096 ranks, 8 x the largest shipped spec, so `plan` takes seconds"
# GPUs (or CPU rank processes) and NICs of one node: an NVL72 rack puts 72 GPUs in one NVLink domain
MAX_PER_NODE = 256
PER_NODE_WHY = "more than a node holds: an NVL72 rack, the largest NVLink domain, has 72 GPUs"


@attrs.frozen
class Hardware(CheckedFields):
    """What one node offers. On `gpu: cpu` a "gpu" is a CPU rank (one process)."""

    gpu: str = key("h200", "The accelerator of every node; `cpu` makes each rank one CPU process.", choice(GPU_KINDS))
    gpus_per_node: int = key(8,
        "GPUs (on `gpu: cpu`, rank processes) per node; an instance fits one node or spans whole nodes.",
        count(MAX_PER_NODE, PER_NODE_WHY))
    nics_per_node: int = key(8, "RDMA NICs per node; KV pages leave a node through these.",
                             count(MAX_PER_NODE, PER_NODE_WHY))
    nic_gbps: float = key(400.0,
        "Line rate of one NIC in Gb/s; the planner and simulator time KV transfers with it.",
        positive_up_to(100_000, "100 Tb/s, far above any NIC's 400-800"))
    cpu_memory_gb: float = key(0.25,
        "On `gpu: cpu`, the memory one rank process may fill with weights, workspace and KV (what a GPU's memory is "
        "to a GPU rank; a GPU's comes from its kind). The default gives the tiny Qwen3-Coder ~1,280 KV pages of 16 "
        "tokens in float32, near the 1,024 a rank had before pools were sized from memory.",
        positive_up_to(65_536, "64 TB, more than any machine holds"))


@attrs.frozen
class Role(CheckedFields):
    """One role (prefill or decode): `replicas` instances of `tp` x `dp` ranks each."""

    replicas: int = key(1, "Instances of this role.", count(MAX_RANKS, RANKS_WHY))
    tp: int = key(1,
        "Tensor-parallel ranks of one dp group; they split the attention heads and the MLP/experts.",
        count(MAX_RANKS, RANKS_WHY))
    dp: int = key(1,
        "Data-parallel attention ranks of one instance; each holds its own requests' KV and is a group of `tp` "
        "ranks.", count(MAX_RANKS, RANKS_WHY))
    ep: int = key(1,
        "Expert parallelism: 1 (every rank holds a tp slice of every routed expert) or `tp * dp` (the routed experts "
        "partitioned over the instance's ranks, each expert whole on one rank, as vLLM's "
        "`--enable-expert-parallel`). Each MoE layer sends every token to the ranks of its experts and back "
        "(all-to-all); with `dp > 1` the dp ranks step in lock-step, an idle one with an empty batch. The plan counts "
        "only the experts a rank holds. Runs on CPU units (gloo all-to-all).", count(MAX_RANKS, RANKS_WHY))

    @property
    def ranks_per_instance(self) -> int:
        return self.tp * self.dp
