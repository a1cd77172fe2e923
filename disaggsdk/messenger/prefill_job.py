"""One prefill job's state, and the staging buffer its context goes out of (prefill side)."""

from __future__ import annotations

from array import array
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.grant_keys import GrantTargets
from disaggsdk.messenger.page_digest import PageDigest, attempt_key
from disaggsdk.messenger.peers import PeerId, UnitInfo
from disaggsdk.messenger.stats import RequestTransfer
from disaggsdk.messenger.write_plan import PoolGeometry


@dataclass(frozen=True)
class ContextStaging:
    """The registered buffer outgoing context payloads are staged in, one slot per request.

    Attributes:
        region: its `MemoryRegion` (writes read from it).
from disaggsdk.report.request_transfer import RequestTransfer

if TYPE_CHECKING:
    from disaggsdk.plan import Plan, Transfer
    from disaggsdk.transfer.descriptors import MemoryRegion, Peer, RegionDescriptor
        buffer: its bytes, ``num_context_slots * context_slot_bytes``.
    """

    region: Any
    buffer: memoryview


@dataclass
class PrefillJob:
    """One accepted request on the prefill side: where its pages go, and how far they got."""

    msg: pr.PrefillRequest
    decode: PeerId
    peer: Any
    transfers: tuple
    dst_regions: list  # RegionDescriptor per decode tp rank
    dst_geometry: PoolGeometry
    context_dst: Any  # RegionDescriptor of the decode's context buffer
    # with per-grant keys: where each decode rank's granted runs are (None: the whole pool is open)
    dst_targets: list[GrantTargets | None] = field(default_factory=list)
    context_target: GrantTargets | None = None
    digest: PageDigest | None = None  # with transport.verify_pages: of every byte sent
    grant_index: dict[int, int] = field(default_factory=dict)  # decode page id -> index in the grant
    pages_queued: int = 0
    inflight_steps: int = 0  # queued step work not yet submitted by the streamer
    futures: list[Future] = field(default_factory=list)
    context_sent: bool = False
    failure: str | None = None  # set once: the job stops sending and reports after draining
    aborted: bool = False
    slot: int = -1
    num_bytes: int = 0
    num_writes: int = 0
    first_submit_s: float = 0.0
    last_done_s: float = 0.0
    forward_end_s: float = 0.0
    arrived_s: float = 0.0  # time.monotonic() when the request frame was accepted
    forward_start_s: float = 0.0  # ... when the step with its first chunk began

    def record(self, request_id: str) -> RequestTransfer:
        """This job's measurements, once every write of it completed."""
        return RequestTransfer(request_id, "prefill", len(self.msg.token_ids), bytes=self.num_bytes,
                               writes=self.num_writes, transfer_s=max(0.0, self.last_done_s - self.first_submit_s),
                               lead_s=self.forward_end_s - self.first_submit_s, arrived_s=self.arrived_s,
                               forward_start_s=self.forward_start_s, forward_end_s=self.forward_end_s)

    @classmethod
    def for_request(cls, msg: pr.PrefillRequest, sender: PeerId, info: UnitInfo, peer: Any, plan: Any,
                    src_instance: str, num_layers: int, secret: bytes | None = None) -> PrefillJob:
        """A new job for an admitted request from decode unit ``info`` (``peer``: its endpoint).

        Args:
            secret: the deployment secret when pages are verified (``transport.verify_pages``), else None.
        Raises:
            ValueError: the request's grant segments lie outside the decode unit's pool or slot.
        """
        from disaggsdk.transfer import RegionDescriptor

        route = plan.route(src_instance, info.instance)
        pools = [RegionDescriptor.from_bytes(r) for r in info.pool_regions]
        context = RegionDescriptor.from_bytes(info.context_region)
        targets = [GrantTargets(pools[d.tp_rank], d.segments) if d.segments else None
                   for d in sorted(msg.destinations, key=lambda d: d.tp_rank)]
        c = msg.context
        context_target = GrantTargets(context, [c.segment]) if c is not None and c.segment is not None else None
        digest = PageDigest(attempt_key(secret, msg.request_id, msg.generation, msg.imm)) if secret else None
        # the pages decode holds already never move: the job starts as if they were queued
        return cls(msg=msg, decode=sender, peer=peer, transfers=route.transfers_for(msg.request_id),
                   pages_queued=msg.num_cached_pages, dst_regions=pools,
                   dst_geometry=dst_geometry(plan, src_instance, info, num_layers), context_dst=context,
                   dst_targets=targets, context_target=context_target, digest=digest,
                   grant_index={p: i for i, p in enumerate(msg.destinations[0].page_ids)})


def dst_geometry(plan: Any, src_instance: str, info: UnitInfo, num_layers: int) -> PoolGeometry:
    """The geometry of decode unit ``info``'s pool, from the route's page size and its region length."""
    from disaggsdk.transfer import RegionDescriptor

    page_bytes = plan.route(src_instance, info.instance).dst_shape.page_bytes
    length = RegionDescriptor.from_bytes(info.pool_regions[0]).length_bytes
    return PoolGeometry.of_region(num_layers, page_bytes, length)


def imms(imm: int, n: int) -> array:
    """``n`` copies of immediate ``imm``: one per write of a batch (u32, as the native side reads them)."""
    return array("I", [imm]) * n
