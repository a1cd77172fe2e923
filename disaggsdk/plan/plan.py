"""The plan of a deployment: instances, ranks, placement, sharding and routes, renderable and JSON.

`make_plan` is pure: the same spec gives the same plan, random choices included (seeded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.models import ModelArch, dtype_bytes, resolve_model
from disaggsdk.plan.kv_tiers import unit_tiers
from disaggsdk.plan.memory import InstanceMemory, kv_layers, memory_problems, spec_memory
from disaggsdk.plan.pages import PageShape, page_shape
from disaggsdk.plan.placement import Instance, place_instances
from disaggsdk.plan.routes import CONTEXT_DST_TP_RANK, CONTEXT_SRC_TP_RANK, Route, make_route
from disaggsdk.plan.writes import expected_writes, num_prefill_pages
from disaggsdk.spec.field_checks import JsonValue
from disaggsdk.spec.rules import size_problems
from disaggsdk.spec.types import Spec

if TYPE_CHECKING:
    from rich.console import Group

    from disaggsdk.plan.render import TextPrinter

SCHEMA_VERSION = 2  # 2: each instance's "memory"
DEFAULT_NUM_TOKENS = 1024


@attrs.frozen
class Plan:
    """Everything the launcher, engine and messenger need to agree on before a process starts."""

    spec: Spec
    arch: ModelArch
    instances: tuple[Instance, ...]  # prefill first, then decode
    routes: tuple[Route, ...]  # one per (prefill, decode) pair, prefill-major
    memory: tuple[InstanceMemory, ...]  # per instance, in `instances` order
    # routes between instances of roles other than the spec's (a unit that changed role), made when first asked
    _other_routes: dict[tuple[str, str], Route] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def memory_problems(self) -> list[str]:
        """What does not fit its memory ("<yaml path>: <what, and the fix>"); empty when every rank fits."""
        return memory_problems(self.spec, self.arch, {m.role: m.ranks for m in self.memory})

    def instance_memory(self, name: str) -> InstanceMemory:
        """The memory of instance ``name``.

        Raises:
            KeyError: no such instance.
        """
        return self.memory[self._index_of(name)]

    @property
    def prefill(self) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.role == "prefill")

    @property
    def decode(self) -> tuple[Instance, ...]:
        return tuple(i for i in self.instances if i.role == "decode")

    @property
    def num_nodes(self) -> int:
        return 1 + max((r.node for i in self.instances for r in i.ranks), default=-1)

    def instance(self, name: str) -> Instance:
        """The instance called ``name`` (e.g. "decode-2").

        Raises:
            KeyError: no such instance.
        """
        return self.instances[self._index_of(name)]

    def _index_of(self, name: str) -> int:
        # `memory` lists the instances in the same order as `instances`
        for index, inst in enumerate(self.instances):
            if inst.name == name:
                return index
        raise KeyError(f"no instance {name!r}; instances: {[i.name for i in self.instances]}")

    def route(self, prefill: str, decode: str) -> Route:
        """The route from instance ``prefill`` to instance ``decode``.

        Raises:
            KeyError: no such pair.
        """
        for route in self.routes:
            if (route.prefill, route.decode) == (prefill, decode):
                return route
        # a unit may serve the other role (`serve.autoscale`, `Deployment.rebalance`): the route between
        # any two instances is the same pure function of their shapes
        pair = (prefill, decode)
        if pair not in self._other_routes:
            src, dst = self.instance(prefill), self.instance(decode)  # KeyError: no such instance
            self._other_routes[pair] = make_route(src, dst, _page_shape(self.spec, self.arch, src),
                                                  _page_shape(self.spec, self.arch, dst),
                                                  kv_layers(self.spec, self.arch), self.spec.seed)
        return self._other_routes[pair]

    @property
    def kv_layers(self) -> int:
        """Layers of KV every rank keeps and every transfer moves: the model's, plus its MTP layer's
        when the deployment drafts with it (prefill fills that layer too, so decode never
        recomputes the prompt for it)."""
        return kv_layers(self.spec, self.arch)

    def to_json(self, num_tokens: int = DEFAULT_NUM_TOKENS) -> dict[str, JsonValue]:
        """The plan as plain JSON data, schema documented in docs/plan-json.md (schema_version 2).

        Args:
            num_tokens: prompt length for which ``expected_writes`` are given.

        Returns:
            A dict of str/int/list/None values, ready for `json.dumps`.
        """
        spec, arch = self.spec, self.arch
        layout = spec.kv.layout
        return {
            "schema_version": SCHEMA_VERSION,
            "name": spec.label,
            "model": {
                "name": spec.model,
                "attention": arch.attention,
                "num_layers": arch.num_layers,
                "kv_layers": self.kv_layers,
                "num_kv_heads": arch.num_kv_heads,
                "head_dim": arch.head_dim,
                "latent_dim": arch.kv_lora_rank + arch.qk_rope_head_dim,
            },
            "kv": {
                "layout": layout,
                "page_size": spec.kv.page_size,
                "dtype": spec.kv.dtype,
                "dtype_bytes": dtype_bytes(spec.kv.dtype),
                "tiers": [t.to_json() for t in unit_tiers(self)],
            },
            "seed": spec.seed,
            "num_nodes": self.num_nodes,
            "num_tokens": num_tokens,
            "num_pages": num_prefill_pages(num_tokens, spec.kv.page_size),
            "instances": [_instance_json(self, inst) for inst in self.instances],
            "routes": [_route_json(route, num_tokens, layout) for route in self.routes],
        }

    def __rich__(self) -> Group:
        from disaggsdk.plan.render import plan_renderable

        return plan_renderable(self)

    def _repr_html_(self) -> str:
        from disaggsdk.plan.render import plan_html

        return plan_html(self)

    def __str__(self) -> str:
        """The tables a terminal shows, as plain text: ``print(plan)`` in a script prints them."""
        from disaggsdk.plan.render import plan_text

        return plan_text(self)

    def _repr_pretty_(self, printer: TextPrinter, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text view (a terminal console, text/plain): the tables, not the fields


def make_plan(spec: Spec, arch: ModelArch | None = None) -> Plan:
    """Plan a deployment: place every rank, shard the KV, route every (prefill, decode) pair.

    Args:
        spec: the deployment (validated by `load_spec` / `Cluster`, checked again here where the
            planner depends on it).
        arch: the model's architecture; resolved from ``spec.model`` when None.

    Returns:
        The plan.

    Raises:
        SpecError: more ranks or instance pairs than a plan takes (`spec.rules.size_problems`), tp
            incompatible with the model's KV heads, or an instance that does not fit the node shape.
        ModelError: ``spec.model`` cannot be resolved.
    """
    too_large = size_problems(spec)  # a spec built in Python skips the rules: 10^23 replicas never end
    if too_large:
        raise SpecError(too_large)
    if arch is None:
        arch = resolve_model(spec.model)
    instances = place_instances(
        spec.roles,
        spec.hardware,
        arch.attention,
        arch.num_kv_heads,
    )
    routes = tuple(
        make_route(
            p, d, _page_shape(spec, arch, p), _page_shape(spec, arch, d), kv_layers(spec, arch), spec.seed
        )
        for p in instances
        if p.role == "prefill"
        for d in instances
        if d.role == "decode"
    )
    by_role = spec_memory(spec, arch)
    memory = tuple(InstanceMemory(inst.name, inst.role, inst.tp, inst.dp, spec.roles[inst.role].ep,
                                  by_role[inst.role]) for inst in instances)
    return Plan(spec, arch, instances, routes, memory)


def instance_page_shape(plan: Plan, inst: Instance) -> PageShape:
    """The page shape of one page of one layer on a rank of ``inst``."""
    return _page_shape(plan.spec, plan.arch, inst)


def _page_shape(spec: Spec, arch: ModelArch, inst: Instance) -> PageShape:
    latent = arch.kv_lora_rank + arch.qk_rope_head_dim
    return page_shape(
        inst.sharding, spec.kv.page_size, arch.head_dim, latent, dtype_bytes(spec.kv.dtype)
    )


def _instance_json(plan: Plan, inst: Instance) -> dict[str, JsonValue]:
    shape = instance_page_shape(plan, inst)
    return {
        "name": inst.name,
        "role": inst.role,
        "index": inst.index,
        "tp": inst.tp,
        "dp": inst.dp,
        "nodes": list(inst.nodes),
        "num_replica_sets": inst.sharding.num_replica_sets,
        "page_bytes": shape.page_bytes,
        "kv_bytes_per_token_rank": shape.page_bytes * plan.kv_layers // shape.page_size,
        "memory": plan.instance_memory(inst.name).to_json(),
        "ranks": [
            {
                "index": r.index,
                "rank": r.rank,
                "dp_rank": r.dp_rank,
                "tp_rank": r.tp_rank,
                "node": r.node,
                "gpu": r.gpu,
                "nic": r.nic,
                "kv_heads": list(r.kv_heads) if isinstance(r.kv_heads, tuple) else r.kv_heads,
                "replica_set": r.replica_set,
            }
            for r in inst.ranks
        ],
    }


def _route_json(route: Route, num_tokens: int, layout: str) -> dict[str, JsonValue]:
    expected = expected_writes(route, num_tokens, layout)
    return {
        "prefill": route.prefill,
        "decode": route.decode,
        "kind": route.kind,
        "source_per_request": route.source_per_request,
        "replica_assignment": list(route.replica_assignment),
        "transfers": [
            {
                "src_rank": t.src_tp_rank,
                "dst_rank": t.dst_tp_rank,
                "heads": list(t.heads) if isinstance(t.heads, tuple) else t.heads,
                "writes_per_page_layer": t.writes_per_page_layer,
                "page_runs": {name: attrs.asdict(t.page_runs(name)) for name in ("HND", "NHD")},
            }
            for t in route.transfers
        ],
        "context": {"src_rank": CONTEXT_SRC_TP_RANK, "dst_rank": CONTEXT_DST_TP_RANK, "writes": 1},
        "layout": layout,
        "expected_writes": [
            {
                "dst_rank": r.dst_tp_rank,
                "kv_writes": r.kv_writes,
                "context_writes": r.context_writes,
                "total": r.total,
            }
            for r in expected.ranks
        ],
        "expected_writes_total": expected.total,
    }
