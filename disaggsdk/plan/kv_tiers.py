"""What the KV tiers (`$.kv.tiers`) hold per unit of a plan: bytes and pages of the host, disk and store tiers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from disaggsdk.plan.memory import GB, kv_bytes_per_token_rank
from disaggsdk.spec.field_checks import JsonValue
from disaggsdk.spec.topology import RoleName

if TYPE_CHECKING:
    from disaggsdk.plan.plan import Plan


@attrs.frozen
class UnitTiers:
    """The tiers one unit of a role reads: its share of its node's host tier, its disk tier, the shared store."""

    role: RoleName
    units_on_node: int  # units that split the node's host tier
    page_bytes: int  # one page of rank 0, every KV layer
    host_bytes: int
    disk_bytes: int
    store_bytes: int  # the deployment's one store, shared by every unit

    def pages(self, nbytes: int) -> int:
        """Pages ``nbytes`` of a tier hold."""
        return nbytes // self.page_bytes if self.page_bytes else 0

    @property
    def private_pages(self) -> int:
        """Pages the unit's own tiers (host share and disk) hold past its pool."""
        return self.pages(self.host_bytes) + self.pages(self.disk_bytes)

    def to_json(self) -> dict[str, JsonValue]:
        """Bytes and pages per tier (docs/plan-json.md)."""
        return {"role": self.role, "units_on_node": self.units_on_node, "page_bytes": self.page_bytes,
                **{f"{tier}_{what}": value for tier, nbytes in (("host", self.host_bytes), ("disk", self.disk_bytes),
                                                                  ("store", self.store_bytes))
                   for what, value in (("bytes", nbytes), ("pages", self.pages(nbytes)))}}


def units_on_node(plan: Plan, instance: str) -> int:
    """Units on the node of ``instance``'s first rank, as the plan places them (they split its host KV tier)."""
    node = plan.instance(instance).nodes[0]
    return sum(inst.dp for inst in plan.instances if node in inst.nodes)


def unit_tiers(plan: Plan) -> tuple[UnitTiers, ...]:
    """Each role's unit tiers (its first instance's; all of a role are alike), or () when every tier is off."""
    spec, tiers = plan.spec, plan.spec.kv.tiers
    if not tiers.enabled:
        return ()
    out = []
    for role in spec.roles:
        first = next((inst for inst in plan.instances if inst.role == role), None)
        if first is None:
            continue
        sharing = units_on_node(plan, first.name)
        page_bytes = spec.kv.page_size * kv_bytes_per_token_rank(spec, plan.arch, first.tp)
        store = int(tiers.store_gb * GB) if tiers.store == "launch" else 0  # a named store says its own size
        out.append(UnitTiers(role, sharing, page_bytes, int(tiers.host_gb * GB) // sharing, int(tiers.disk_gb * GB),
                             store))
    return tuple(out)
