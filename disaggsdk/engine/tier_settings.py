"""A unit's KV tiers as its engine opens them: `$.kv.tiers` resolved to bytes, a directory and an address."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from typing import Literal

from disaggsdk.spec.types import Spec

GB = 10**9


@dataclass(frozen=True)
class TierSettings:
    """One unit's tiers, resolved from `$.kv.tiers`: sizes in bytes, its own disk directory, the store's address."""

    host_bytes: int
    disk_bytes: int
    disk_dir: str
    store_address: str | None  # "host:port"; None: no store
    store_bytes: int
    write_policy: Literal["write_through", "on_eviction"]
    model_identity: str  # what makes two engines' pages the same bytes: model, weights, their dtype

    @classmethod
    def from_spec(cls, spec: Spec, unit_name: str, units_on_node: int) -> TierSettings | None:
        """``spec``'s tiers for the unit ``unit_name``, one of ``units_on_node`` units that split the node's
        host tier; None when every tier is off. ``$.kv.tiers.store: launch`` must have been resolved to an
        address by whoever started the store (`launch.kv_store_server`)."""
        tiers = spec.kv.tiers
        if not tiers.enabled:
            return None
        if tiers.store == "launch":
            raise ValueError("$.kv.tiers.store: launch is resolved to the started store's address before units start")
        root = tiers.disk_path or os.path.join(tempfile.gettempdir(), "disaggsdk-kv-tiers")
        return cls(
            host_bytes=int(tiers.host_gb * GB) // max(1, units_on_node), disk_bytes=int(tiers.disk_gb * GB),
            disk_dir=os.path.join(root, spec.name or "deployment", unit_name),
            store_address=None if tiers.store == "off" else tiers.store, store_bytes=int(tiers.store_gb * GB),
            write_policy=tiers.write_policy,
            model_identity=f"{spec.model}|{spec.engine.load_format}|seed={spec.seed}|{spec.engine.dtype}",
        )
