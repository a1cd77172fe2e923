"""One prefill job's state, and the staging buffer its context goes out of (prefill side).

Three threads touch a job: the prefill unit's main thread (it accepts the job, queues its steps,
sends its context, aborts it and settles it in ``poll``), the streamer thread (it submits each
layer's writes and fails a job whose submit raised) and the transfer engine's pump thread (it
completes the writes). What more than one of them writes is `JobSends`, behind its one lock; the
rest of a `PrefillJob` is fixed when the request is accepted, or the main thread's alone.
"""

from __future__ import annotations

import threading
import time
from array import array
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.grant_keys import GrantTargets
from disaggsdk.messenger.page_digest import PageDigest, attempt_key
from disaggsdk.messenger.peers import PeerId, UnitInfo
from disaggsdk.messenger.span_log import SpanLog
from disaggsdk.messenger.write_plan import PoolGeometry
from disaggsdk.records.request_transfer import RequestTransfer

if TYPE_CHECKING:
    from disaggsdk.plan import Plan, Transfer
    from disaggsdk.transfer.descriptors import MemoryRegion, Peer, RegionDescriptor


@dataclass(frozen=True)
class ContextStaging:
    """The registered buffer outgoing context payloads are staged in, one slot per request.

    Attributes:
        region: its registration (writes read from it).
        buffer: its bytes, ``num_context_slots * context_slot_bytes``.
    """

    region: MemoryRegion
    buffer: memoryview


@dataclass(frozen=True)
class SendsState:
    """A job's sends as of one moment (`JobSends.settle`)."""

    busy: bool  # queued steps not yet submitted, or writes not yet completed locally
    aborted: bool
    failure: str | None
    num_bytes: int
    num_writes: int
    first_submit_s: float  # time.monotonic() when its first write was submitted (0.0: none yet)
    last_done_s: float  # ... when its latest write completed locally
    last_layer_s: float  # ... when the writes of the KV's last layer were last submitted


class JobSends:
    """What a job's writes did so far and whether it stopped sending: the part of a job that more
    than one thread writes (the streamer submits and fails, the pump completes, the main thread
    queues steps and aborts). One lock guards every field; nothing else writes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight_steps = 0  # queued step work the streamer has not finished submitting
        self._futures: list[Future[None]] = []
        self._num_bytes = 0
        self._num_writes = 0
        self._first_submit_s = 0.0
        self._last_done_s = 0.0
        self._last_layer_s = 0.0
        self._aborted = False
        self._failure: str | None = None  # set once: the job stops sending and reports after draining

    @property
    def aborted(self) -> bool:
        """Whether the job stopped sending (its writes still drain)."""
        with self._lock:
            return self._aborted

    def abort(self, reason: str) -> None:
        """Stop sending; the first reason given is the one reported."""
        with self._lock:
            self._aborted = True
            self._failure = self._failure or reason

    def step_queued(self) -> None:
        """A step's page range of this job went to the streamer (main thread)."""
        with self._lock:
            self._inflight_steps += 1

    def step_submitted(self) -> None:
        """Every layer of one queued step was submitted (or skipped)."""
        with self._lock:
            self._inflight_steps -= 1

    def track(self, fut: Future[None], num_bytes: int, num_writes: int) -> None:
        """Count a submitted batch of ``num_writes`` writes; ``fut`` resolves when they completed locally."""
        now = time.monotonic()
        with self._lock:
            self._futures.append(fut)
            self._num_bytes += num_bytes
            self._num_writes += num_writes
            self._first_submit_s = self._first_submit_s or now
        fut.add_done_callback(self._write_done)  # outside the lock: it runs here when fut is done already

    def last_layer_submitted(self) -> None:
        """The writes of the KV's last layer (of the latest chunk) were submitted (streamer thread)."""
        now = time.monotonic()
        with self._lock:
            self._last_layer_s = now

    def _write_done(self, _fut: Future[None]) -> None:
        with self._lock:
            self._last_done_s = time.monotonic()

    def settle(self) -> SendsState:
        """The sends as of now; a write that failed aborts the job first (its error is the reason)."""
        with self._lock:
            failed = next((f.exception() for f in self._futures if f.done() and f.exception()), None)
            if failed is not None and not self._aborted:
                self._aborted, self._failure = True, f"write failed: {failed}"
            return self._state()

    def state(self) -> SendsState:
        """The sends as of now."""
        with self._lock:
            return self._state()

    def _state(self) -> SendsState:
        busy = self._inflight_steps > 0 or not all(f.done() for f in self._futures)
        return SendsState(busy, self._aborted, self._failure, self._num_bytes, self._num_writes,
                          self._first_submit_s, self._last_done_s, self._last_layer_s)


@dataclass
class PrefillJob:
    """One accepted request on the prefill side: where its pages go, and how far they got.

    Fixed once accepted, but for ``sends`` (`JobSends`, behind its lock) and the fields marked
    "main thread" (only the prefill unit's main thread reads or writes them).
    """

    msg: pr.PrefillRequest
    decode: PeerId
    peer: Peer
    transfers: tuple[Transfer, ...]
    dst_regions: list[RegionDescriptor]  # per decode tp rank
    dst_geometry: PoolGeometry
    context_dst: RegionDescriptor  # the decode's context buffer
    slot: int  # this unit's context staging slot
    arrived_s: float  # time.monotonic() when the request frame was accepted
    # with per-grant keys: where each decode rank's granted runs are (None: the whole pool is open)
    dst_targets: list[GrantTargets | None] = field(default_factory=list)
    context_target: GrantTargets | None = None
    digest: PageDigest | None = None  # with transport.verify_pages: of every byte sent (thread-safe)
    grant_index: dict[int, int] = field(default_factory=dict)  # decode page id -> index in the grant
    sends: JobSends = field(default_factory=JobSends)
    pages_queued: int = 0  # main thread: pages handed to the streamer so far
    context_sent: bool = False  # main thread
    forward_start_s: float = 0.0  # main thread: when the step with its first chunk began
    forward_end_s: float = 0.0  # main thread: when the step with its last chunk ended
    spans: SpanLog | None = None  # when the router traces it: its phases here (thread-safe)
    num_chunks: int = 0  # main thread: its chunks that ran so far

    def record(self, request_id: str) -> RequestTransfer:
        """This job's measurements, once every write of it completed."""
        sent = self.sends.state()
        return RequestTransfer(request_id, "prefill", len(self.msg.token_ids), bytes=sent.num_bytes,
                               writes=sent.num_writes, transfer_s=max(0.0, sent.last_done_s - sent.first_submit_s),
                               lead_s=self.forward_end_s - sent.first_submit_s, arrived_s=self.arrived_s,
                               forward_start_s=self.forward_start_s, forward_end_s=self.forward_end_s,
                               last_layer_s=sent.last_layer_s)

    @classmethod
    def for_request(cls, msg: pr.PrefillRequest, sender: PeerId, info: UnitInfo, peer: Peer, plan: Plan,
                    src_instance: str, num_layers: int, *, slot: int, arrived_s: float,
                    secret: bytes | None = None) -> PrefillJob:
        """A new job for an admitted request from decode unit ``info`` (``peer``: its endpoint).

        Args:
            slot: the context staging slot it will use.
            arrived_s: when its request frame was accepted.
            secret: the deployment secret when pages are verified (``$.transport.verify_pages``), else None.
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
                   slot=slot, arrived_s=arrived_s, dst_targets=targets, context_target=context_target,
                   digest=digest, grant_index={p: i for i, p in enumerate(msg.destinations[0].page_ids)})


@dataclass
class ChunkTrace:
    """A traced job's chunk in one step, as its layers are seen done (streamer thread only).

    Attributes:
        index: the chunk's number in its request (0, 1, ...).
        span: the chunk's span in the job's `SpanLog` (the parent of its layers' compute spans).
        layer_start_ns: when the layer now computing began: the step's start, then each layer's end
            as the streamer saw it (``time.time_ns()``).
    """

    index: int
    span: int
    layer_start_ns: int


class PageRange(NamedTuple):
    """Pages ``[first, stop)`` of a job's prompt that one step completes: the step's work for it that
    the streamer hands back layer by layer (``page_ids``: the request's source pages, in order;
    ``chunk``: where its layers' spans go when the job is traced)."""

    job: PrefillJob
    first: int
    stop: int
    page_ids: tuple[int, ...]
    chunk: ChunkTrace | None = None


def dst_geometry(plan: Plan, src_instance: str, info: UnitInfo, num_layers: int) -> PoolGeometry:
    """The geometry of decode unit ``info``'s pool, from the route's page size and its region length."""
    from disaggsdk.transfer import RegionDescriptor

    page_bytes = plan.route(src_instance, info.instance).dst_shape.page_bytes
    length = RegionDescriptor.from_bytes(info.pool_regions[0]).length_bytes
    return PoolGeometry.of_region(num_layers, page_bytes, length)


def imms(imm: int, n: int) -> array[int]:
    """``n`` copies of immediate ``imm``: one per write of a batch (u32, as the native side reads them)."""
    return array("I", [imm]) * n
