"""Instances and their ranks, placed on nodes, GPUs and NICs.

Instances are packed onto nodes in spec order, prefill first, then decode. An instance larger
than a node starts on a fresh node and spans whole nodes; a smaller one never straddles two nodes
(it moves to the next node when the current one lacks room), so its tp all-reduces stay on one
node's interconnect. Inside an instance, rank ``dp_rank * tp + tp_rank`` takes the next GPU, so
each tp group is contiguous. Each GPU uses its nearest NIC: ``gpu * nics_per_node //
gpus_per_node``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.models.arch import AttentionKind
from disaggsdk.plan.sharding import HeadRange, Sharding, make_sharding
from disaggsdk.spec.topology import ROLES, Hardware, Role, RoleName


@attrs.frozen
class Rank:
    """One process of an instance and the device it runs on."""

    index: int  # global rank index across the deployment
    instance: str  # e.g. "decode-2"
    rank: int  # index inside the instance: dp_rank * tp + tp_rank
    node: int
    gpu: int  # device index on its node
    nic: int  # NIC index on its node, the one nearest `gpu`
    dp_rank: int
    tp_rank: int
    kv_heads: HeadRange  # [start, stop) of global KV heads, or "replicated" (MLA)
    replica_set: int | None  # GQA with tp > KV heads: which full copy this rank belongs to


@attrs.frozen
class Instance:
    """One engine instance: ``dp`` groups of ``tp`` ranks that serve requests together."""

    name: str  # "<role>-<index>"
    role: RoleName
    index: int  # index among the instances of its role
    tp: int
    dp: int
    sharding: Sharding
    ranks: tuple[Rank, ...]

    @property
    def nodes(self) -> tuple[int, ...]:
        """Nodes this instance occupies, in order."""
        return tuple(sorted({r.node for r in self.ranks}))

    def rank_of(self, dp_rank: int, tp_rank: int) -> Rank:
        """The rank at (dp_rank, tp_rank)."""
        assert 0 <= dp_rank < self.dp and 0 <= tp_rank < self.tp
        return self.ranks[dp_rank * self.tp + tp_rank]


def nearest_nic(gpu: int, hardware: Hardware) -> int:
    """The NIC index nearest GPU ``gpu`` on a node (NICs spread evenly over the GPUs)."""
    return gpu * hardware.nics_per_node // hardware.gpus_per_node


def place_instances(roles: Mapping[RoleName, Role], hardware: Hardware, attention: AttentionKind,
                    num_kv_heads: int) -> tuple[Instance, ...]:
    """Create every instance of every role and place its ranks.

    Args:
        roles: role name ("prefill", "decode") -> `Role`; placed in `ROLES` order.
        hardware: the node shape (GPUs and NICs per node).
        attention: the model's attention kind, "gqa" or "mla".
        num_kv_heads: the model's KV heads (GQA).

    Returns:
        Instances in placement order, prefill first.

    Raises:
        SpecError: an empty node shape, a bad tp for the model, or an instance larger than a node
            whose size is not a whole number of nodes.
    """
    gpn = hardware.gpus_per_node
    if gpn < 1 or hardware.nics_per_node < 1:
        raise SpecError("$.hardware: gpus_per_node and nics_per_node must be at least 1, got "
                        f"{gpn} and {hardware.nics_per_node}")
    instances: list[Instance] = []
    node, used = 0, 0  # next free slot: GPU `used` on node `node`
    global_index = 0
    for role_name in ROLES:
        role = roles[role_name]
        sharding = make_sharding(attention, role.tp, num_kv_heads, f"$.{role_name}.tp")
        size = role.tp * role.dp
        if size < 1 or role.dp < 1:
            raise SpecError(f"$.{role_name}.dp: dp must be at least 1, got {role.dp}")
        if size > gpn and size % gpn:
            raise SpecError(f"$.{role_name}: an instance of tp*dp = {size} ranks is larger than a node of "
                            f"{gpn} GPUs but not a whole number of nodes; use a multiple of {gpn} or at "
                            f"most {gpn}")
        for index in range(role.replicas):
            if used and (size > gpn or used + size > gpn):
                node, used = node + 1, 0  # never straddle: start on a fresh node
            name = f"{role_name}-{index}"
            ranks = []
            for local in range(size):
                slot = used + local
                gpu = slot % gpn
                dp_rank, tp_rank = divmod(local, role.tp)
                ranks.append(
                    Rank(
                        index=global_index,
                        instance=name,
                        rank=local,
                        node=node + slot // gpn,
                        gpu=gpu,
                        nic=nearest_nic(gpu, hardware),
                        dp_rank=dp_rank,
                        tp_rank=tp_rank,
                        kv_heads=sharding.kv_heads(tp_rank),
                        replica_set=sharding.replica_set(tp_rank),
                    )
                )
                global_index += 1
            instances.append(
                Instance(name, role_name, index, role.tp, role.dp, sharding, tuple(ranks))
            )
            node, used = node + (used + size) // gpn, (used + size) % gpn
    return tuple(instances)
