"""A request's handoff state on the decode side, and the quarantine of ended attempts."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.grant_keys import GrantKeys
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.records.request_transfer import RequestTransfer

if TYPE_CHECKING:
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.kv.page_allocator import PageGrant
    from disaggsdk.messenger.ports import DecodeEngine, Transport
    from disaggsdk.spec.types import Spec

DEAD_PEER_GRACE_S = 1.0  # writes already on the wire from a dead peer land within this
DRAIN_GRACE_S = 0.2  # after a sender's local completions, for its last writes to land here


class CounterFired:
    """When an attempt's immediate counter resolved (``time.monotonic()``; 0.0 until then).

    Stamped by the counter future's done callback, on the transfer engine's pump thread (or on the
    main thread when the attempt ends and cancels it), read on the decode unit's main thread: the
    one field of a handoff another thread writes, so it sits behind its own lock. One per attempt:
    a late callback of an ended attempt stamps that attempt's, never the next one's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at_s = 0.0

    def stamp(self, _counter: Future[None]) -> None:
        """The done callback: the counter resolved now."""
        with self._lock:
            self._at_s = time.monotonic()

    @property
    def at_s(self) -> float:
        """When it resolved; 0.0 while it has not."""
        with self._lock:
            return self._at_s


@dataclass
class Handoff:
    """One request on the decode side until its KV arrived: the current attempt and what was tried.

    The decode unit's main thread owns it; only ``fired`` is stamped from another (`CounterFired`).
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams | None  # None: the engine's defaults
    attempt: int = 0
    prefill: str | None = None
    tried: set[str] = field(default_factory=set)
    imm: int = 0
    grant: PageGrant | None = None  # the current attempt's pages
    slot: int = -1
    counter: Future[None] | None = None
    fired: CounterFired = field(default_factory=CounterFired)  # when the current attempt's counter resolved
    send_future: Future[None] | None = None
    deadline: float = 0.0
    submitted_s: float = 0.0  # time.monotonic() when the request reached this unit
    sent_s: float = 0.0  # ... when the current attempt's prefill request was sent
    num_cached_pages: int = 0  # the current attempt's prompt pages decode held already (not sent)
    keys: GrantKeys | None = None  # the current attempt's per-grant registrations (None: whole pool open)
    digest: bytes | None = None  # the current attempt's page digest from prefill (transport.verify_pages)
    traced: bool = False  # the router traces it: its handoff's phases become spans (`span_log`)

    def record(self, forward_end_s: float, admitted_s: float) -> RequestTransfer:
        """The measurements of a request whose KV arrived (``forward_end_s``: prefill's, from the context)."""
        fired = self.fired.at_s or admitted_s
        return RequestTransfer(self.request_id, "decode", len(self.prompt_ids),
                               exposed_s=max(0.0, fired - forward_end_s), attempts=self.attempt,
                               forward_end_s=forward_end_s, submitted_s=self.submitted_s, sent_s=self.sent_s,
                               fired_s=fired, admitted_s=admitted_s)


@dataclass
class Quarantine:
    """Pages (and a context slot) of an ended attempt, held until no write of it can still land."""

    owner: str  # the name the engine holds the pages under (`DecodePages.rename_pages`)
    slot: int
    prefill: str
    request_id: str
    generation: int
    release_at: float | None = None  # None: wait for the prefill unit's drain report
    keys: GrantKeys | None = None  # revoked on release, when no write of the attempt can still be coming


def prefill_request(h: Handoff, grant: PageGrant, me: UnitInfo, spec: Spec, page_size: int) -> pr.PrefillRequest:
    """The `PrefillRequest` of ``h``'s current attempt from decode unit ``me``: its granted pages
    (``grant``: those after the ``h.num_cached_pages`` decode holds already) on every rank, and its
    context slot; with per-grant keys (``h.keys``), the registrations that open exactly those."""
    keys = h.keys
    return pr.PrefillRequest(
        request_id=h.request_id, decode_instance=str(me.peer_id), generation=grant.generation, imm=h.imm,
        token_ids=h.prompt_ids, model=spec.model, layout=spec.kv.layout, page_size=page_size,
        kv_dtype=spec.kv.dtype, decode_tp=len(me.pool_regions),
        destinations=[pr.DestinationRank(r, region, list(grant.page_ids), keys.segments[r] if keys else [])
                      for r, region in enumerate(me.pool_regions)],
        context=pr.ContextSlot(me.context_region, h.slot * me.context_slot_bytes, me.context_slot_bytes,
                               keys.context if keys else None),
        prompt_logprobs=h.params.prompt_logprobs if h.params is not None else None,
        num_cached_pages=h.num_cached_pages,
        traced=h.traced,
    )


def release_quarantine(quarantine: list[Quarantine], now: float | None, engine: DecodeEngine,
                       free_slots: list[int], transfer: Transport) -> list[Quarantine]:
    """Revoke the grant keys, free the pages (and return the context slots) of every entry due at
    ``now`` (None: all, at shutdown); returns the entries still held.

    Args:
        engine: the engine whose pages the entries' owners hold.
        transfer: the transport the entries' grant keys were registered with.
    """
    kept = []
    for q in quarantine:
        if now is None or (q.release_at is not None and now >= q.release_at):
            if q.keys is not None:
                q.keys.revoke(transfer)  # before the pages can be granted again
            engine.kv.release(q.owner)
            if q.slot >= 0:
                free_slots.append(q.slot)
        else:
            kept.append(q)
    return kept
