"""The decode side of the handoff: grant pages, ask a prefill unit, count writes, admit, retry."""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.context import ContextShapeError, clear_context, unpack_context
from disaggsdk.messenger.freshness import FrameCodec
from disaggsdk.messenger.grant_keys import open_grant
from disaggsdk.messenger.handoff import (
    DEAD_PEER_GRACE_S,
    DRAIN_GRACE_S,
    CounterFired,
    Handoff,
    Quarantine,
    prefill_request,
    release_quarantine,
)
from disaggsdk.messenger.kv_migration import KVMigrations
from disaggsdk.messenger.page_digest import PageDigest, add_granted_pages, attempt_key
from disaggsdk.messenger.peers import FrameCounters, UnitInfo
from disaggsdk.messenger.ports import DecodeEngine, Transport
from disaggsdk.messenger.prefill_choice import PrefillChoice, scores_prompt
from disaggsdk.messenger.stats import TransferTotals
from disaggsdk.messenger.write_plan import PoolGeometry
from disaggsdk.plan.memory import num_pages_per_rank
from disaggsdk.plan.writes import expected_writes, num_prefill_pages
from disaggsdk.records.request_transfer import RequestTransfer
from disaggsdk.records.span_records import RequestSpanRecords, SpanRecord, epoch_ns
from disaggsdk.transfer.errors import TransferError

if TYPE_CHECKING:
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.kv.pools.host_mirror import HostMirror
    from disaggsdk.plan import Plan
    from disaggsdk.transfer.descriptors import MemoryRegion, Peer

log = logging.getLogger(__name__)



class DecodeMessenger:
    """Decode half of the messenger for one decode unit.

    Args:
        me: this unit.
        engine: the unit's `LLMEngine` (mode "mixed" so a request can be prefilled locally).
        transfer: the unit's `TransferEngine`.
        plan: the deployment plan (routes, layout).
        context_buffer: the registered context buffer ``[num_context_slots * context_slot_bytes]``.
        secret: the deployment secret for control frames.
        deadline_s: how long one attempt may take before it is retried.
        pools: each tp rank's registered KV pool (`MemoryRegion`), in tp order: what per-grant keys
            open and page digests read; needed when either is on.
        context_region: the registration of ``context_buffer`` (for per-grant keys).
        grant_keys: open only each attempt's pages, under keys revoked when it ends (`grant_keys`).
        verify_pages: admit a request only when its pages match prefill's digest (`page_digest`).
        kv_mirror: when ``pools`` are host mirrors of the engine's pools, what copies a request's
            landed pages into the engine's before it is scheduled (`kv.pools.host_mirror`).
        codec: the unit's frame codec when it had one already (it changed role); None: a new one.
    """

    def __init__(self, me: UnitInfo, engine: DecodeEngine, transfer: Transport, plan: Plan, context_buffer: memoryview,
                 secret: bytes, deadline_s: float, *, pools: Sequence[MemoryRegion] = (),
                 context_region: MemoryRegion | None = None,
                 grant_keys: bool = False, verify_pages: bool = False, kv_mirror: HostMirror | None = None,
                 codec: FrameCodec | None = None):
        self.me, self.engine, self.transfer, self.plan = me, engine, transfer, plan
        self.kv_mirror = kv_mirror
        self.secret, self.deadline_s = secret, deadline_s
        self.pools, self.context_region = list(pools), context_region
        self.grant_keys, self.verify_pages = grant_keys, verify_pages
        if (grant_keys or verify_pages) and (not self.pools or (grant_keys and context_region is None)):
            raise ValueError("grant keys and page verification need the unit's pool and context registrations")
        # a unit that changed role keeps its codec: its peers' replay guards saw its frame numbers so far
        self.codec = codec or FrameCodec(str(me.peer_id), secret)
        self.context_buffer = context_buffer
        self.layout = plan.spec.kv.layout
        self.page_size = engine.config.page_size
        self._free_slots = list(range(me.num_context_slots))
        self._prefills: dict[str, tuple[UnitInfo, Peer]] = {}
        self._down: dict[str, float] = {}
        self._outstanding: dict[str, int] = {}
        self._handoffs: dict[str, Handoff] = {}
        # request id -> the prefill unit whose KV it was admitted with, until the unit reports its first
        # tokens (the access log's "prefill"); absent: no prefill unit was asked (cached, or prefilled here)
        self.prefilled_by: dict[str, str] = {}
        self._pending: deque[Handoff] = deque()
        self._quarantine: list[Quarantine] = []
        self._imms = itertools.count(1)
        self.frames = FrameCounters()
        self.totals = TransferTotals()
        self.failed: list[tuple[str, str]] = []  # (request_id, message) for the launcher to report
        self.failed_grants: list[str] = []  # why grant keys could not be registered (those requests prefilled here)
        self.traced_spans: list[RequestSpanRecords] = []  # traced requests' handoffs, once admitted
        self.rejected: dict[str, int] = {}  # requests are refused by prefill units, not here
        self.prefill_choice = PrefillChoice(engine, plan.spec.serve.routing,
                                            num_pages_per_rank(plan.spec, "decode", plan.arch),
                                            plan.spec.transfer.max_local_prefill_tokens)
        # decoding requests moving to or from the other decode units (their KV with them)
        self.migrations = KVMigrations(me, engine, transfer, plan.spec, self.codec, self.pools, deadline_s,
                                       self._next_imm, self.totals, grant_keys=grant_keys)

    def close(self) -> None:
        """At shutdown: every peer is gone, nothing can land any more; free the quarantine."""
        self.drain_quarantine()
        self.migrations.close()

    # peers

    def add_peers(self, units: Sequence[UnitInfo]) -> None:
        """Learn the deployment's prefill units, and the decode units requests can move to (address
        book from the launcher)."""
        for info in units:
            if info.role == "prefill":
                self.migrations.forget(info.name)  # a decode unit that now prefills takes no moves
                self.add_prefill(info)
            elif info.role == "decode":
                if info.name in self._prefills:  # a prefill unit that now decodes: ask it nothing more
                    self.peer_down(info.name)
                self.migrations.add_peer(info)

    def add_prefill(self, info: UnitInfo) -> None:
        """Learn a prefill unit (address book from the launcher), or its new incarnation after a restart."""
        if info.name in self._prefills:
            self.prefill_choice.forget(info.name)  # a new incarnation: its prefix cache starts empty
        self._prefills[info.name] = (info, self.transfer.add_peer(info.address))
        self._outstanding.setdefault(info.name, 0)
        self._down.pop(info.name, None)  # quarantined pages of the old one keep their release times

    def peer_down(self, name: str, now: float | None = None) -> None:
        """A prefill unit died: retry its requests now; its quarantined pages free after a grace."""
        now = time.monotonic() if now is None else now
        self.migrations.peer_down(name, now)
        if name not in self._prefills or name in self._down:
            return
        self._down[name] = now
        for q in self._quarantine:
            if q.prefill == name and q.release_at is None:
                q.release_at = now + DEAD_PEER_GRACE_S
        for h in [h for h in self._handoffs.values() if h.prefill == name]:
            self._retry(h, f"prefill unit {name} went down", drained=False, now=now)

    def forget_prefixes(self) -> None:
        """The deployment's prefix caches were reset: ``serve.routing`` forgets what each prefill unit was sent."""
        for name in self._prefills:
            self.prefill_choice.forget(name)

    def submit(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | None,
               traced: bool = False) -> None:
        """Start a request: it runs on the decode engine once its KV has arrived.

        Args:
            traced: the router traces it: its handoff's phases go to ``traced_spans`` once it is
                admitted, and the prefill unit is asked to record its own.
        """
        prompt = list(prompt_ids)
        if len(prompt) == 1:  # nothing to prefill: the one token is the first decode input
            self.engine.kv.add_prefilled_request(request_id, prompt, params)
            return
        now = time.monotonic()
        self._pending.append(Handoff(request_id, prompt, params, submitted_s=now, traced=traced))
        self._start_pending(now)

    def migrate(self, request_id: str, target: str) -> None:
        """Move a decoding request to decode unit ``target`` with its KV (`kv_migration`); how it
        ends comes out of ``migrations.ended``.

        Raises:
            MigrationError: it cannot start (not decoding here, unknown or dead target, host
                mirrors); the request goes on here untouched.
        """
        from disaggsdk.engine.request_migration import MigrationError

        if self.kv_mirror is not None:
            raise MigrationError("moving requests between units whose KV is staged through host mirrors "
                                 "(transport.kv_staging: host) is not supported yet")
        self.migrations.start(request_id, target)

    def abort(self, request_id: str) -> bool:
        """Stop a request still waiting for its KV, or moving. Returns False when it is neither here."""
        if self.migrations.abort(request_id):
            return True
        h = self._handoffs.pop(request_id, None)
        if h is None:
            for p in list(self._pending):
                if p.request_id == request_id:
                    self._pending.remove(p)
                    return True
            return False
        self._end_attempt(h, drained=False, now=time.monotonic())
        return True

    @property
    def num_waiting(self) -> int:
        """Requests waiting for pages or for their KV."""
        return len(self._pending) + len(self._handoffs)

    @property
    def open_grant_keys(self) -> int:
        """Registrations open to remote writes for one attempt each (`grant_keys`): those of attempts
        in flight and of ended ones whose writes may still land (quarantined). 0 when nothing is in
        flight and the quarantine is drained; one left then is a grant that was never revoked."""
        held = [h.keys for h in self._handoffs.values()] + [q.keys for q in self._quarantine]
        return sum(len(keys.registrations) for keys in held if keys is not None) + self.migrations.open_grant_keys

    @property
    def settled(self) -> bool:
        """Whether nothing is in flight here: no request waits for its KV, none moves, no quarantined
        page waits for late writes (the unit may change role now)."""
        return not (self._pending or self._handoffs or self._quarantine or self.migrations.busy)

    @property
    def busy(self) -> bool:
        """Whether requests wait for their KV or move (their counters and deadlines need polling)."""
        return self.num_waiting > 0 or self.migrations.busy

    # the loop

    def on_frame(self, frame: bytes) -> None:
        """Handle one control frame from a prefill unit; bad frames are counted and dropped."""
        opened = self.codec.open(frame)
        if isinstance(opened, str):
            self.frames.count(opened)
            return
        msg = opened.message
        stale = self.migrations.stale
        if self.migrations.on_frame(msg):
            if self.migrations.stale > stale:
                self.frames.count("stale")
            return
        if isinstance(msg, pr.PageDigest):
            h = self._handoffs.get(msg.request_id)
            if h is None or h.grant is None or h.grant.generation != msg.generation or not self.verify_pages:
                self.frames.count("stale")
                return
            h.digest = msg.digest
            return
        if not isinstance(msg, (pr.PrefillRejected, pr.PrefillFailed)):
            self.frames.count("unexpected_kind")
            return
        now = time.monotonic()
        drained = [q for q in self._quarantine if q.request_id == msg.request_id and q.generation == msg.generation]
        for q in drained:  # the old attempt's writes completed at the sender; let them land
            q.release_at = now + DRAIN_GRACE_S
        h = self._handoffs.get(msg.request_id)
        if h is None or h.grant is None or h.grant.generation != msg.generation:
            if not drained:
                self.frames.count("stale")  # a report about an attempt that is long gone
            return
        self._retry(h, f"{h.prefill}: {msg.reason}", drained=True, now=now)

    def poll(self, now: float | None = None) -> None:
        """Admit requests whose counter fired, retry late or failed attempts, free quarantine."""
        now = time.monotonic() if now is None else now
        for h in list(self._handoffs.values()):
            if h.counter is not None and h.counter.done() and not h.counter.cancelled():
                if h.counter.exception() is not None:
                    self._retry(h, f"counter failed: {h.counter.exception()}", drained=False, now=now)
                    continue
                if h.keys is not None:  # every write landed: nothing may land in these pages any more
                    h.keys.revoke(self.transfer)
                if not self.verify_pages:
                    self._admit(h)
                elif h.digest is not None:
                    if self._pages_verified(h):
                        self._admit(h)
                    else:
                        self.totals.counters.kv_pages_failed_verification += 1
                        self._retry(h, "its KV does not match prefill's digest (forged or corrupted writes)",
                                    drained=True, now=now)
                elif now > h.deadline:
                    self._retry(h, f"{h.prefill} sent no page digest within {self.deadline_s:g} s",
                                drained=True, now=now)
            elif h.send_future is not None and h.send_future.done() and h.send_future.exception() is not None:
                self._retry(h, f"cannot reach {h.prefill}: {h.send_future.exception()}", drained=True, now=now)
            elif now > h.deadline:
                self._retry(h, f"{h.prefill} missed the {self.deadline_s:g} s deadline", drained=False, now=now)
        self._quarantine = release_quarantine(self._quarantine, now, self.engine, self._free_slots, self.transfer)
        self.migrations.poll(now)
        self._start_pending(now)

    def drain_quarantine(self) -> None:
        """At shutdown: every peer is gone, nothing can land any more."""
        self._quarantine = release_quarantine(self._quarantine, None, self.engine, self._free_slots, self.transfer)

    # internals

    def _start_pending(self, now: float) -> None:
        while self._pending:
            h = self._pending[0]
            pages = num_prefill_pages(len(h.prompt_ids), self.page_size)
            if not self._free_slots or pages > self.engine.kv.num_free_pages:
                return  # wait for pages or slots to free up
            self._pending.popleft()
            self._send(h, now)

    def _send(self, h: Handoff, now: float) -> None:
        cached_here = self.prefill_choice.cached_pages_if_short(h)
        if cached_here is not None:
            self.totals.counters.requests_prefilled_short += 1
            self._count_not_sent(cached_here)
            self._prefill_locally(h)
            return
        live = [n for n in self._prefills if n not in self._down and n not in h.tried]
        name = self.prefill_choice.prefill_unit(h, live, self._outstanding)
        if name is None:
            self._prefill_locally(h)
            return
        info, peer = self._prefills[name]
        need = num_prefill_pages(len(h.prompt_ids), self.page_size)
        cached = 0 if scores_prompt(h) else self.engine.kv.share_cached_prompt(h.request_id, h.prompt_ids, count=h.attempt == 0)
        if cached == need:  # every page of prompt[:-1] is here: nothing to prefill
            return self._admit_cached(h, cached)
        h.attempt, h.prefill, h.num_cached_pages = h.attempt + 1, name, cached
        # the tokens of the pages after the cached ones: exactly need - cached pages
        grant = h.grant = self.engine.kv.allocate_pages(h.request_id, (need - cached) * self.page_size)
        h.slot = self._free_slots.pop()
        h.imm = self._next_imm()
        h.fired, h.digest = CounterFired(), None
        clear_context(self._slot(h.slot))
        if self.grant_keys:
            size = self.me.context_slot_bytes
            try:
                h.keys = open_grant(self.transfer, self.pools, self._geometry(), grant.page_ids,
                                    self.context_region, h.slot * size, size)
            except TransferError as exc:  # the provider refused a registration: prefill here instead
                self.failed_grants.append(str(exc))
                self.engine.kv.release(h.request_id)
                self._free_slots.append(h.slot)
                h.prefill, h.grant, h.slot = None, None, -1
                self._prefill_locally(h)
                return
        route = self.plan.route(info.instance, self.me.instance)
        count = expected_writes(route, len(h.prompt_ids), self.layout, num_cached_pages=cached).total
        h.counter = self.transfer.expect(h.imm, count)
        h.counter.add_done_callback(h.fired.stamp)
        msg = prefill_request(h, grant, self.me, self.plan.spec, self.page_size)
        self._handoffs[h.request_id] = h
        self._outstanding[name] += 1
        h.deadline, h.sent_s = now + self.deadline_s, now
        h.send_future = self.transfer.send(peer, self.codec.seal(msg))

    def _admit(self, h: Handoff) -> None:
        assert h.prefill is not None and h.grant is not None, "admitted only while an attempt is out"
        del self._handoffs[h.request_id]
        self._outstanding[h.prefill] -= 1
        arch = self.engine.arch
        assert self.engine.kv.holds_grant(h.grant), "a granted page changed owner while pinned"
        try:
            payload = unpack_context(self._slot(h.slot), arch.hidden_size, arch.vocab_size)
        except ContextShapeError as exc:
            self.totals.counters.transfer_failures += 1
            self.engine.kv.release(h.request_id)
            self._free_slots.append(h.slot)
            self.failed.append((h.request_id, str(exc)))
            return
        self._free_slots.append(h.slot)
        if self.kv_mirror is not None:  # every layer landed in the mirror: the engine reads its own pool
            self.kv_mirror.to_device(h.grant.page_ids)
        record = h.record(payload.forward_end_s, admitted_s=time.monotonic())
        self.totals.add(record)
        if h.traced:
            self.traced_spans.append(handoff_spans(record, h.prefill))
        self._count_not_sent(h.num_cached_pages)
        cached_tokens = max(h.num_cached_pages * self.page_size, payload.num_cached_tokens)
        self.engine.kv.add_prefilled_request(h.request_id, h.prompt_ids, h.params, num_cached_tokens=cached_tokens)
        self.prefilled_by[h.request_id] = h.prefill

    def _admit_cached(self, h: Handoff, num_pages: int) -> None:
        """Admit a request whose prompt KV this unit's prefix cache held whole: no prefill unit is asked."""
        self.totals.counters.requests_fully_cached += 1
        self._count_not_sent(num_pages)
        record = RequestTransfer(h.request_id, "decode", len(h.prompt_ids), attempts=0, submitted_s=h.submitted_s,
                                 admitted_s=time.monotonic())
        self.totals.add(record)
        if h.traced:
            self.traced_spans.append(handoff_spans(record, ""))
        self.engine.kv.add_prefilled_request(h.request_id, h.prompt_ids, h.params, num_cached_tokens=num_pages * self.page_size)

    def _count_not_sent(self, num_pages: int) -> None:
        fmt = self.engine.kv.cache.fmt  # rank 0's: every rank of this unit holds the same page ids
        self.totals.counters.count_not_sent(num_pages, num_pages * fmt.num_layers * fmt.page_bytes * len(self.me.pool_regions))

    def _end_attempt(self, h: Handoff, drained: bool, now: float) -> None:
        """Stop counting the current attempt and park its pages until no write can land."""
        if h.prefill is None:
            return
        assert h.grant is not None, "an attempt out has its grant"
        self.transfer.cancel(h.imm)
        self._outstanding[h.prefill] -= 1
        name = h.prefill
        release_at: float | None  # None: until the prefill unit reports its writes drained
        if name in self._down:
            release_at = max(now, self._down[name] + DEAD_PEER_GRACE_S)
        else:
            release_at = now + DRAIN_GRACE_S if drained else None
            if not drained:
                abort = pr.AbortPrefill(h.request_id, h.grant.generation, str(self.me.peer_id))
                self.transfer.send(self._prefills[name][1], self.codec.seal(abort))
        owner = f"{h.request_id}\x00quarantine{h.attempt}"  # no client id can contain NUL
        self.engine.kv.rename_pages(h.request_id, owner)
        self._quarantine.append(Quarantine(owner, h.slot, name, h.request_id, h.grant.generation, release_at, h.keys))
        h.prefill, h.grant, h.slot, h.counter, h.send_future, h.keys = None, None, -1, None, None, None

    def _retry(self, h: Handoff, reason: str, drained: bool, now: float) -> None:
        assert h.prefill is not None, "only an attempt out is retried"
        # logged as well as counted: /metrics says how many, the unit's log says which and why
        log.warning("request %s: KV handoff attempt %d from %s failed: %s; retrying", h.request_id, h.attempt,
                    h.prefill, reason)
        self.totals.counters.transfer_failures += 1
        h.tried.add(h.prefill)
        self._handoffs.pop(h.request_id, None)
        self._end_attempt(h, drained, now)
        self.totals.counters.requests_retried += 1
        self._pending.appendleft(h)  # first in line for pages
        self._start_pending(now)

    def _prefill_locally(self, h: Handoff) -> None:
        if h.attempt:
            log.warning("request %s: prefilling it here after %d failed KV handoff attempt(s)", h.request_id, h.attempt)
        self.totals.counters.prefilled_locally += 1
        record = RequestTransfer(h.request_id, "decode", len(h.prompt_ids), attempts=h.attempt, prefilled_locally=True,
                                 submitted_s=h.submitted_s, admitted_s=time.monotonic())
        self.totals.add(record)
        if h.traced:
            self.traced_spans.append(handoff_spans(record, ""))
        self.engine.add_request(h.request_id, h.prompt_ids, h.params)

    def _geometry(self) -> PoolGeometry:
        fmt = self.engine.kv.cache.fmt  # every rank of this unit has rank 0's geometry
        return PoolGeometry(fmt.num_layers, fmt.num_pages, fmt.page_bytes)

    def _pages_verified(self, h: Handoff) -> bool:
        """Whether the attempt's pages and context slot, as held here, give prefill's digest."""
        assert h.digest is not None and h.grant is not None, "verified only once prefill's digest came"
        digest = PageDigest(attempt_key(self.secret, h.request_id, h.grant.generation, h.imm))
        add_granted_pages(digest, [p.view() for p in self.pools], self._geometry(), h.grant.page_ids)
        digest.add_context(self._slot(h.slot))
        return digest.matches(h.digest)

    def _slot(self, slot: int) -> memoryview:
        size = self.me.context_slot_bytes
        return self.context_buffer[slot * size : (slot + 1) * size]

    def _next_imm(self) -> int:
        return next(self._imms) % (1 << 32) or next(self._imms)



def handoff_spans(record: RequestTransfer, prefill_unit: str) -> RequestSpanRecords:
    """A traced request's handoff on the decode side as spans (`records.span_records`): from its arrival
    to its admission to the engine, and inside it the wait for pages and a context slot, the wait for
    the counter (prefill computing and writing its KV) and the admission itself.

    Args:
        record: the handoff's measurements (``time.monotonic()`` of this process).
        prefill_unit: the prefill unit whose KV it was admitted with ("": none, cached or prefilled here).
    """
    offset_ns = time.time_ns() - time.monotonic_ns()

    def ns(s: float) -> int:
        return epoch_ns(s, offset_ns)

    r = record
    start, end = ns(r.submitted_s), ns(r.admitted_s)
    how = "prefilled here" if r.prefilled_locally else prefill_unit or "prefix cache"
    spans = [SpanRecord("kv handoff", start, end, -1, {"kv_from": how, "attempts": r.attempts,
                                                       "num_tokens": r.num_tokens})]
    if r.sent_s:
        spans.append(SpanRecord("wait for pages", start, ns(r.sent_s), 0))
        spans.append(SpanRecord("wait for kv (counter)", ns(r.sent_s), ns(r.fired_s), 0,
                                {"prefill_unit": prefill_unit, "exposed_transfer_ms": r.exposed_s * 1e3}))
        spans.append(SpanRecord("admit", ns(r.fired_s), end, 0))
    return RequestSpanRecords(r.request_id, start, end, spans)
