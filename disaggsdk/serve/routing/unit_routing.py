"""The router's choice of serving unit: `serve.routing` applied to each prompt's page hashes.

`messenger.prefix_affinity` holds the policy and the index of what was routed where; this adds
what the router knows: which roles serve requests, the deployment's page size and KV pages per
unit (the spec), and the prompt's hashes, computed only when the policy looks at them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from disaggsdk.kv.block_hash import page_hashes
from disaggsdk.messenger.prefix_affinity import Decision, RoutingPolicy

if TYPE_CHECKING:
    from disaggsdk.spec import Spec

SERVING_ROLES = ("decode", "mixed")  # the units a request is sent to (prefill units are the decode units' peers)


class UnitRouting:
    """Which serving unit takes a prompt, remembering what went where.

    Args:
        policy: ``"cache_aware"`` or ``"least_loaded"`` (`Serve.routing`).
        page_size: tokens per KV page (`KV.page_size`): a prompt's pages are hashed at this size.
        capacity_pages: pages remembered per unit (a decode rank's pool, `num_pages_per_rank`; a unit may hold more
            across its ranks, and the index then merely forgets sooner than the unit does).
    Raises:
        ValueError: an unknown policy, or a capacity below 1.
    """

    def __init__(self, policy: str, page_size: int, capacity_pages: int):
        self.policy = RoutingPolicy(policy, capacity_pages=capacity_pages)
        self.page_size = page_size

    @classmethod
    def from_spec(cls, spec: Spec) -> UnitRouting:
        """The routing a `Spec` asks for, remembering as many pages per unit as a decode rank's pool and its own KV
        tiers (host share and disk, `$.kv.tiers`) hold: a prompt whose prefix went down a tier is still a hit there."""
        from disaggsdk.plan import make_plan
        from disaggsdk.plan.kv_tiers import unit_tiers
        from disaggsdk.plan.memory import num_pages_per_rank

        tier_pages = 0
        if spec.kv.tiers.enabled:
            tier_pages = next((t.private_pages for t in unit_tiers(make_plan(spec)) if t.role == "decode"), 0)
        return cls(spec.serve.routing, spec.kv.page_size, num_pages_per_rank(spec, "decode") + tier_pages)

    @property
    def last(self) -> Decision | None:
        """The latest choice (target, matched pages, prompt pages), or None before any."""
        return self.policy.last

    def hashes(self, prompt_ids: Sequence[int]) -> list[bytes]:
        """The page hashes `pick` wants for ``prompt_ids``: none under least_loaded (it never looks),
        none for ids that are not int64 (the send refuses those; the router must not fail first)."""
        if self.policy.name != "cache_aware":
            return []
        try:
            return page_hashes(prompt_ids, self.page_size)
        except (OverflowError, TypeError):
            return []

    def pick(self, serving: Sequence[str], hashes: Sequence[bytes], load: Mapping[str, int]) -> str | None:
        """Choose among ``serving`` for a prompt and record the choice.

        Args:
            serving: the healthy serving units.
            hashes: the prompt's page hashes, from `hashes`.
            load: requests in flight per unit.
        Returns:
            A unit of ``serving``, or None when it is empty.
        """
        if not serving:
            return None
        unit = self.policy.choose(serving, hashes, load)
        self.policy.routed(unit, hashes)
        return unit

    def forget(self, unit: str) -> None:
        """Drop what was routed to ``unit`` (it died; a restart starts with an empty cache)."""
        self.policy.forget(unit)
