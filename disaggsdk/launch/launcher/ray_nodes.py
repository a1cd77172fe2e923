"""Which Ray node runs each node of a plan, checked before any actor starts.

The plan numbers its nodes 0, 1, ... and places every rank on one (`plan.placement`). A Ray
cluster offers nodes with resources: GPUs for a CUDA spec, and for a CPU spec the custom resource
`SLOT_RESOURCE` (how many ranks a node hosts: ``ray start --resources '{"disaggsdk_slot": 8}'``),
so a CPU test cluster of logical nodes on one machine says what each node may hold. Plan nodes
take the cluster's alive nodes in Ray's order, each the first unused one with room for all its
ranks; a cluster without room is one error that lists, per plan node, what it needs and lacks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Required, TypedDict

from disaggsdk.launch.base import LaunchError

if TYPE_CHECKING:
    from disaggsdk.plan import Plan
    from disaggsdk.spec.types import Spec

SLOT_RESOURCE = "disaggsdk_slot"
PIN_RESOURCE_PREFIX = "disaggsdk_node_"


class RayNodeInfo(TypedDict, total=False):
    """One entry of `ray.nodes()`, the keys read here."""

    NodeID: Required[str]
    NodeManagerAddress: str
    Alive: bool
    Resources: dict[str, float]


@dataclass(frozen=True)
class RayNode:
    """One alive node of the cluster, as `ray.nodes()` describes it."""

    node_id: str
    address: str  # its IP (NodeManagerAddress)
    resources: dict[str, float]

    @property
    def short_id(self) -> str:
        return self.node_id[:8]


def rank_resource(spec: Spec) -> str:
    """The Ray resource one rank of ``spec`` takes: a GPU, or a CPU slot."""
    return "GPU" if spec.device == "cuda" else SLOT_RESOURCE


def pin_resource(plan_node: int) -> str:
    """The Ray resource that pins a Ray node to plan node ``plan_node`` (its amount does not matter)."""
    return f"{PIN_RESOURCE_PREFIX}{plan_node}"


def ranks_per_node(plan: Plan) -> dict[int, int]:
    """How many ranks the plan puts on each of its nodes.

    Raises:
        LaunchError: an instance spans nodes (a unit keeps its tp workers on its own node: they
            share its KV pools through memfds).
    """
    for inst in plan.instances:
        if len(inst.nodes) > 1:
            raise LaunchError(f"instance {inst.name} spans nodes {list(inst.nodes)}: a unit and its tp workers run "
                              f"on one node; use a tp that fits a node ({plan.spec.hardware.gpus_per_node} ranks)")
    return dict(sorted(Counter(r.node for inst in plan.instances for r in inst.ranks).items()))


def map_plan_nodes(plan: Plan, ray_nodes: list[RayNodeInfo], resource: str) -> dict[int, RayNode]:
    """Plan node -> the Ray node that runs it.

    Args:
        plan: the deployment's plan.
        ray_nodes: `ray.nodes()`.
        resource: what a rank takes (`rank_resource`).
    Raises:
        LaunchError: the cluster lacks room; the message says what each plan node needs and misses.
    """
    alive = [RayNode(n["NodeID"], n.get("NodeManagerAddress", "?"), dict(n.get("Resources", {})))
             for n in ray_nodes if n.get("Alive")]
    free = [n for n in alive if n.resources.get(resource, 0) >= 1]
    need_by_node = ranks_per_node(plan)
    pins = {pin_resource(plan_node) for plan_node in need_by_node}
    mapping: dict[int, RayNode] = {}
    problems = []
    for plan_node, need in need_by_node.items():
        pinned = [n for n in alive if pin_resource(plan_node) in n.resources]
        # a plan node with a pinned Ray node takes only that; the others never take a node pinned to one
        candidates = ([n for n in free if n in pinned] if pinned
                      else [n for n in free if not pins & n.resources.keys()])
        node = next((n for n in candidates if n.resources[resource] >= need), None)
        if node is None:
            largest = max((n.resources[resource] for n in candidates), default=0)
            where = f"the node pinned to it ({pin_resource(plan_node)})" if pinned else "the largest unused node"
            problems.append(f"plan node {plan_node} needs {need} {resource} on one Ray node; "
                            + (f"{where} offers {largest:g}" if candidates else "no unused node offers any"))
            continue
        free.remove(node)
        mapping[plan_node] = node
    if problems:
        offered = ", ".join(f"{n.short_id} ({n.address}): {n.resources.get(resource, 0):g}" for n in alive) or "none"
        hint = (f"start nodes with `ray start --address HEAD:PORT --resources '{{\"{SLOT_RESOURCE}\": N}}'`"
                if resource == SLOT_RESOURCE else "add GPU nodes to the cluster")
        raise LaunchError("the Ray cluster cannot hold this plan: " + "; ".join(problems)
                          + f". Alive nodes and their {resource}: {offered}; {hint}")
    return mapping
