"""Moving a decoding request, with its KV, from one decode unit to another (both sides)."""

from __future__ import annotations

import itertools
import logging
import time
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from disaggsdk.engine.request_migration import MigrationError
from disaggsdk.errors import DisaggError
from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.freshness import FrameCodec
from disaggsdk.messenger.grant_keys import GrantKeys, GrantTargets, open_grant
from disaggsdk.messenger.handoff import DEAD_PEER_GRACE_S, DRAIN_GRACE_S, Quarantine, release_quarantine
from disaggsdk.messenger.peers import PeerId, UnitInfo
from disaggsdk.messenger.stats import TransferTotals
from disaggsdk.messenger.write_plan import PoolGeometry
from disaggsdk.transfer.errors import TransferError

if TYPE_CHECKING:
    from disaggsdk.engine.request_migration import RunningRequestState
    from disaggsdk.kv.page_allocator import PageGrant
    from disaggsdk.messenger.ports import DecodeEngine, Transport
    from disaggsdk.spec.types import Spec
    from disaggsdk.transfer.descriptors import MemoryRegion, Peer

log = logging.getLogger(__name__)

OutgoingPhase = Literal["offered", "writing", "cancelling"]


@dataclass(frozen=True)
class MovedIn:
    """A request this unit took over: the router streams its tokens from here from now on.

    Attributes:
        num_output_tokens: output tokens it had when it left the source (the router has those).
        num_bytes: KV bytes that landed for it (every page of every layer of every rank).
    """

    request_id: str
    source: str  # the source unit's name
    num_output_tokens: int
    num_bytes: int


@dataclass(frozen=True)
class MoveEnded:
    """A move this unit started that ended: ``moved`` (the target decodes it now, this unit freed its
    pages) or not (it goes on here, or was aborted, and ``reason`` says why)."""

    request_id: str
    target: str
    moved: bool
    reason: str = ""


@dataclass
class Outgoing:
    """A request this unit is moving away, until the target admitted it or the move ended."""

    request_id: str
    migration: int
    target: str
    state: RunningRequestState
    page_ids: list[int]
    deadline: float
    phase: OutgoingPhase = "offered"
    futures: list[Future[None]] = field(default_factory=list)
    num_bytes: int = 0
    num_writes: int = 0
    resume: bool = True  # when cancelling: resume it here (False: it was aborted, drop it)
    reason: str = ""


@dataclass
class Incoming:
    """A request another unit is moving here, until its KV landed (or the move ended)."""

    request_id: str
    migration: int
    source: str
    state: RunningRequestState
    grant: PageGrant
    imm: int
    counter: Future[None]
    num_bytes: int
    deadline: float
    keys: GrantKeys | None = None


class KVMigrations:
    """Both sides of moving decoding requests between this decode unit and its decode peers.

    Args:
        me: this unit.
        engine: its engine.
        transfer: its transport.
        spec: the deployment's spec (model, KV layout, page size, dtype).
        codec: the messenger's frame codec (one sequence of frames per unit).
        pools: each tp rank's registered pool, in tp order (writes read from them; grants open them).
        deadline_s: how long an offer may wait for its answer, and an accepted move for its writes.
        next_imm: the messenger's immediate numbering (one space for handoffs and moves).
        totals: the messenger's counters, which moves count into.
        grant_keys: open only each move's pages to the source's writes (`grant_keys`).
    """

    def __init__(self, me: UnitInfo, engine: DecodeEngine, transfer: Transport, spec: Spec, codec: FrameCodec,
                 pools: Sequence[MemoryRegion], deadline_s: float, next_imm: Callable[[], int],
                 totals: TransferTotals, grant_keys: bool = False):
        self.me, self.engine, self.transfer, self.spec, self.codec = me, engine, transfer, spec, codec
        self.pools, self.deadline_s, self.next_imm, self.totals = list(pools), deadline_s, next_imm, totals
        self.grant_keys = grant_keys
        self._peers: dict[str, tuple[UnitInfo, Peer]] = {}
        self._down: dict[str, float] = {}
        self._out: dict[str, Outgoing] = {}
        self._in: dict[str, Incoming] = {}
        self._admitted: dict[str, tuple[str, int]] = {}  # request id -> (source, migration) it came with
        self._quarantine: list[Quarantine] = []
        self._numbers = itertools.count(1)
        self.moved_in: list[MovedIn] = []  # for the unit to report, in order, before the request's tokens
        self.ended: list[MoveEnded] = []  # moves started here that ended, for the unit to report
        self.stale = 0  # frames about moves long gone (counted as "stale" by the messenger)

    @property
    def geometry(self) -> PoolGeometry:
        """Where pages sit in each of this unit's pools (every rank has rank 0's geometry)."""
        fmt = self.engine.kv.cache.fmt
        return PoolGeometry(fmt.num_layers, fmt.num_pages, fmt.page_bytes)

    # peers

    def add_peer(self, info: UnitInfo) -> None:
        """Learn a decode unit (or its new incarnation); moves go only between units of equal shape."""
        if info.name == self.me.name:
            return
        self._peers[info.name] = (info, self.transfer.add_peer(info.address))
        self._down.pop(info.name, None)

    def forget(self, name: str) -> None:
        """``name`` is not a decode unit any more (it changed role, idle): no move goes to it."""
        self._peers.pop(name, None)
        self._down.pop(name, None)

    def peer_down(self, name: str, now: float) -> None:
        """A decode unit died: moves to it resume here at once (nothing of theirs can land anywhere
        that matters); moves from it stop, their grant quarantined for the writes on the wire."""
        if name not in self._peers:
            return
        self._down[name] = now
        for out in [o for o in self._out.values() if o.target == name]:
            del self._out[out.request_id]
            self._finish_out(out, resume=out.resume, reason=out.reason or f"target unit {name} went down")
        for inc in [i for i in self._in.values() if i.source == name]:
            self._drop_in(inc, release_at=now + DEAD_PEER_GRACE_S)
        for q in self._quarantine:
            if q.prefill == name and q.release_at is None:
                q.release_at = now + DEAD_PEER_GRACE_S

    @property
    def busy(self) -> bool:
        """Whether moves are in flight (their frames, writes and counters need polling)."""
        return bool(self._out or self._in or self._quarantine)

    @property
    def open_grant_keys(self) -> int:
        """Registrations open for moves in flight or quarantined (see `DecodeMessenger.open_grant_keys`)."""
        held = [i.keys for i in self._in.values()] + [q.keys for q in self._quarantine]
        return sum(len(k.registrations) for k in held if k is not None)

    def is_moving(self, request_id: str) -> bool:
        """Whether ``request_id`` is being moved away from here or to here."""
        return request_id in self._out or request_id in self._in

    # the source side

    def start(self, request_id: str, target: str, now: float | None = None) -> None:
        """Move a decoding request to decode unit ``target``: suspend it and offer it there.

        Raises:
            MigrationError: ``target`` is unknown, down or this unit, the request is not decoding
                here or already moving; it goes on here untouched.
        """
        now = time.monotonic() if now is None else now
        if target == self.me.name:
            raise MigrationError(f"request {request_id!r} is on {target} already")
        if target not in self._peers or target in self._down:
            known = ", ".join(sorted(n for n in self._peers if n not in self._down)) or "none"
            raise MigrationError(f"{target!r} is not a live decode unit of this deployment (live: {known})")
        if self.is_moving(request_id):
            raise MigrationError(f"request {request_id!r} is moving already")
        state = self.engine.kv.suspend(request_id)
        out = Outgoing(request_id, next(self._numbers), target, state, self.engine.kv.page_ids(request_id),
                       deadline=now + self.deadline_s)
        self._out[request_id] = out
        fmt = self.engine.kv.cache.fmt
        offer = pr.MigrateOffer(request_id=request_id, migration=out.migration, source=str(self.me.peer_id),
                                state=state, model=self.spec.model, layout=self.spec.kv.layout,
                                page_size=self.engine.config.page_size, kv_dtype=self.spec.kv.dtype,
                                tp=len(self.me.pool_regions), num_layers=fmt.num_layers, page_bytes=fmt.page_bytes)
        self._send(target, offer)

    def cancel(self, request_id: str, reason: str) -> bool:
        """Call off moving ``request_id`` away from here (its router judged the target unreachable): it
        resumes here once no write of it is in flight, and the target is told to free its grant, as at
        the deadline. False: no move of it from here is under way (it ended, or the target admitted it)."""
        out = self._out.get(request_id)
        if out is None or out.phase == "cancelling":
            return False
        self._cancel(out, reason, resume=True)
        return True

    def _on_accept(self, msg: pr.MigrateAccept) -> None:
        out = self._out.get(msg.request_id)
        if out is None or out.migration != msg.migration or out.phase != "offered":
            self.stale += 1
            return
        info, peer = self._peers[out.target]
        try:
            self._submit(out, info, peer, msg)
        except (TransferError, ValueError, DisaggError) as exc:  # nothing to land: the target counts in vain
            self._cancel(out, f"writing its pages failed: {exc}", resume=True)
            return
        out.phase, out.deadline = "writing", time.monotonic() + self.deadline_s

    def _submit(self, out: Outgoing, info: UnitInfo, peer: Peer, msg: pr.MigrateAccept) -> None:
        """Write every page of every layer of every rank into the target's granted pages."""
        from disaggsdk.transfer import RegionDescriptor, WriteBatch

        dsts = sorted(msg.destinations, key=lambda d: d.tp_rank)
        if len(dsts) != len(self.pools) or any(len(d.page_ids) != len(out.page_ids) for d in dsts):
            raise ValueError(f"the target granted {[len(d.page_ids) for d in dsts]} pages on {len(dsts)} ranks for "
                             f"{len(out.page_ids)} pages on {len(self.pools)}")
        g = self.geometry
        for rank, dst in enumerate(dsts):
            region = RegionDescriptor.from_bytes(info.pool_regions[rank])
            dst_geometry = PoolGeometry.of_region(g.num_layers, g.page_bytes, region.length_bytes)
            bad = [p for p in dst.page_ids if not 0 <= p < dst_geometry.num_pages]
            if bad or len(set(dst.page_ids)) != len(dst.page_ids):  # never write outside what was granted
                raise ValueError(f"the target granted pages {bad[:5] or 'twice'} outside its pool of "
                                 f"{dst_geometry.num_pages} pages")
            src_offs, dst_offs = array("Q"), array("Q")
            for layer in range(g.num_layers):
                for sp, dp in zip(out.page_ids, dst.page_ids):
                    src_offs.append(g.page_offset(layer, sp))
                    dst_offs.append(dst_geometry.page_offset(layer, dp))
            lengths = array("Q", [g.page_bytes]) * len(src_offs)
            batches = (GrantTargets(region, dst.segments).split(dst_offs, src_offs, lengths) if dst.segments
                       else [(region, dst_offs, [src_offs, lengths])])
            for desc, d_offs, (s_offs, lens) in batches:
                batch = WriteBatch(self.pools[rank], desc, s_offs, d_offs, lens, array("I", [msg.imm]) * len(lens))
                out.futures.append(self.transfer.submit(peer, batch))
                out.num_bytes += sum(lens)
                out.num_writes += len(lens)

    def _on_admitted(self, msg: pr.MigrateAdmitted) -> None:
        out = self._out.get(msg.request_id)
        if out is None or out.migration != msg.migration or out.phase != "writing":
            self.stale += 1  # a cancelled move the target admitted before our cancel: it drops it then
            return
        del self._out[out.request_id]
        # every write landed there, so none is in flight here: the pages are free to go
        self.engine.kv.release_suspended(out.request_id)
        c = self.totals.counters
        c.requests_moved_out += 1
        c.moved_out_bytes += out.num_bytes
        self.ended.append(MoveEnded(out.request_id, out.target, moved=True))

    def _on_refused(self, msg: pr.MigrateRefused) -> None:
        out = self._out.get(msg.request_id)
        if out is None or out.migration != msg.migration or out.phase == "cancelling":
            self.stale += 1
            return
        self._cancel(out, f"{out.target} refused it: {msg.reason}", resume=out.resume)

    def _cancel(self, out: Outgoing, reason: str, resume: bool) -> None:
        """End a move from here: once no write of it is in flight, tell the target and resume (or drop)."""
        out.phase, out.reason, out.resume = "cancelling", reason, resume
        self._poll_cancelling(out)

    def _poll_cancelling(self, out: Outgoing) -> None:
        if not all(f.done() for f in out.futures):
            return
        del self._out[out.request_id]
        if out.target not in self._down:
            self._send(out.target, pr.MigrateCancel(out.request_id, out.migration, out.reason))
        self._finish_out(out, resume=out.resume, reason=out.reason)

    def _finish_out(self, out: Outgoing, resume: bool, reason: str) -> None:
        log.warning("request %s: moving it to %s failed: %s; %s", out.request_id, out.target, reason,
                    "it goes on here" if resume else "it was aborted")
        self.totals.counters.moves_failed += 1
        if resume:
            self.engine.kv.resume(out.request_id)
        else:
            self.engine.kv.release_suspended(out.request_id)
        self.ended.append(MoveEnded(out.request_id, out.target, moved=False, reason=reason))

    # the target side

    def _on_offer(self, msg: pr.MigrateOffer, now: float) -> None:
        source = PeerId.parse(msg.source)
        known = self._peers.get(source.name)
        if known is None or known[0].incarnation != source.incarnation or source.name in self._down:
            self.stale += 1  # not a live decode peer we know: nobody to answer
            return
        reason = self._refusal(msg)
        if reason is None:
            try:
                self._grant(msg, now)
                return
            except (DisaggError, TransferError) as exc:
                reason = str(exc)
        self._send(source.name, pr.MigrateRefused(msg.request_id, msg.migration, reason))

    def _refusal(self, msg: pr.MigrateOffer) -> str | None:
        fmt = self.engine.kv.cache.fmt
        mine = (self.spec.model, self.spec.kv.layout, self.engine.config.page_size, self.spec.kv.dtype,
                len(self.me.pool_regions), fmt.num_layers, fmt.page_bytes)
        theirs = (msg.model, msg.layout, msg.page_size, msg.kv_dtype, msg.tp, msg.num_layers, msg.page_bytes)
        if mine != theirs:
            return (f"KV shapes differ (model, layout, page size, dtype, tp, layers, page bytes): "
                    f"{theirs} there, {mine} here")
        if msg.request_id in self._in or msg.request_id in self._out or self.engine.kv.page_ids(msg.request_id):
            return f"request id {msg.request_id!r} is in use here"
        need = msg.state.num_pages(msg.page_size)
        if need > self.engine.kv.num_free_pages:
            return f"{need} free pages needed, {self.engine.kv.num_free_pages} here"
        return None

    def _grant(self, msg: pr.MigrateOffer, now: float) -> None:
        source = PeerId.parse(msg.source).name
        state = msg.state
        grant = self.engine.kv.allocate_pages(msg.request_id, state.num_computed_tokens)
        keys = None
        try:
            if self.grant_keys:
                keys = open_grant(self.transfer, self.pools, self.geometry, grant.page_ids, None)
            imm = self.next_imm()
            num_writes = len(self.pools) * self.geometry.num_layers * len(grant.page_ids)
            counter = self.transfer.expect(imm, num_writes)
        except BaseException:
            if keys is not None:
                keys.revoke(self.transfer)
            self.engine.kv.release(msg.request_id)
            raise
        num_bytes = num_writes * self.geometry.page_bytes
        self._in[msg.request_id] = Incoming(msg.request_id, msg.migration, source, state, grant, imm, counter,
                                            num_bytes, deadline=now + self.deadline_s, keys=keys)
        dsts = [pr.DestinationRank(r, region, list(grant.page_ids), keys.segments[r] if keys else [])
                for r, region in enumerate(self.me.pool_regions)]
        self._send(source, pr.MigrateAccept(msg.request_id, msg.migration, imm, dsts))

    def _poll_in(self, inc: Incoming, now: float) -> None:
        counter = inc.counter
        if counter.done() and not counter.cancelled() and counter.exception() is None:
            del self._in[inc.request_id]
            if inc.keys is not None:
                inc.keys.revoke(self.transfer)  # every write landed: nothing may land any more
            try:
                self.engine.kv.add_migrated_request(inc.state)
            except DisaggError as exc:  # its state does not load here: the source keeps it
                self.engine.kv.release(inc.request_id)
                self._send(inc.source, pr.MigrateRefused(inc.request_id, inc.migration, str(exc)))
                return
            c = self.totals.counters
            c.requests_moved_in += 1
            c.moved_in_bytes += inc.num_bytes
            self._admitted[inc.request_id] = (inc.source, inc.migration)
            self.moved_in.append(MovedIn(inc.request_id, inc.source, len(inc.state.output_ids), inc.num_bytes))
            self._send(inc.source, pr.MigrateAdmitted(inc.request_id, inc.migration))
        elif counter.done() or now > inc.deadline:
            why = "its writes did not all land" if counter.done() else f"its writes missed the {self.deadline_s:g} s deadline"
            self._send(inc.source, pr.MigrateRefused(inc.request_id, inc.migration, why))
            self._drop_in(inc, release_at=None)  # until the source says its writes drained (or dies)

    def _drop_in(self, inc: Incoming, release_at: float | None) -> None:
        """Stop counting a move to here and park its pages until no write of it can land."""
        self._in.pop(inc.request_id, None)
        self.transfer.cancel(inc.imm)
        owner = f"{inc.request_id}\x00moving{inc.migration}"  # no client id can contain NUL
        self.engine.kv.rename_pages(inc.request_id, owner)
        self._quarantine.append(Quarantine(owner, -1, inc.source, inc.request_id, inc.migration, release_at, inc.keys))

    def _on_cancel(self, msg: pr.MigrateCancel, now: float) -> None:
        inc = self._in.get(msg.request_id)
        if inc is not None and inc.migration == msg.migration:
            self._drop_in(inc, release_at=now + DRAIN_GRACE_S)
            return
        for q in self._quarantine:  # a move this side gave up on: the source's writes drained
            if q.request_id == msg.request_id and q.generation == msg.migration and q.release_at is None:
                q.release_at = now + DRAIN_GRACE_S
                return
        if self._admitted.get(msg.request_id, ("", 0))[1] == msg.migration:
            # admitted here before the source gave up on it: the source goes on with it, so it ends here
            del self._admitted[msg.request_id]
            self.engine.abort(msg.request_id)
            return
        self.stale += 1

    # either side

    def on_frame(self, msg: pr.Message, now: float | None = None) -> bool:
        """Handle a migration frame (False: not one of these kinds)."""
        now = time.monotonic() if now is None else now
        if isinstance(msg, pr.MigrateOffer):
            self._on_offer(msg, now)
        elif isinstance(msg, pr.MigrateAccept):
            self._on_accept(msg)
        elif isinstance(msg, pr.MigrateAdmitted):
            self._on_admitted(msg)
        elif isinstance(msg, pr.MigrateRefused):
            self._on_refused(msg)
        elif isinstance(msg, pr.MigrateCancel):
            self._on_cancel(msg, now)
        else:
            return False
        return True

    def abort(self, request_id: str) -> bool:
        """Abort a request while it moves (either side). False: it is not moving here."""
        out = self._out.get(request_id)
        if out is not None:
            if out.phase == "cancelling":
                out.resume = False
            else:
                self._cancel(out, "aborted", resume=False)
            return True
        inc = self._in.get(request_id)
        if inc is not None:
            self._send(inc.source, pr.MigrateRefused(request_id, inc.migration, "aborted"))
            self._drop_in(inc, release_at=None)
            return True
        self._admitted.pop(request_id, None)
        return False

    def poll(self, now: float | None = None) -> None:
        """Advance: answers' deadlines, failed or drained writes, landed moves, the quarantine."""
        now = time.monotonic() if now is None else now
        for out in list(self._out.values()):
            if out.phase == "cancelling":
                self._poll_cancelling(out)
            elif out.phase == "writing" and any(f.done() and f.exception() is not None for f in out.futures):
                failed = next(f.exception() for f in out.futures if f.done() and f.exception() is not None)
                self._cancel(out, f"a write failed: {failed}", resume=True)
            elif now > out.deadline:
                what = "no answer" if out.phase == "offered" else "no admission"
                self._cancel(out, f"{what} from {out.target} within {self.deadline_s:g} s", resume=True)
        for inc in list(self._in.values()):
            self._poll_in(inc, now)
        self._quarantine = release_quarantine(self._quarantine, now, self.engine, [], self.transfer)
        if len(self._admitted) > 1024:  # forget moves whose requests ended (an abort needs the recent ones only)
            self._admitted = {r: m for r, m in self._admitted.items() if self.engine.kv.page_ids(r)}

    def close(self) -> None:
        """At shutdown: nothing can land any more; free the quarantine."""
        self._quarantine = release_quarantine(self._quarantine, None, self.engine, [], self.transfer)

    def _send(self, name: str, msg: pr.Message) -> None:
        self.transfer.send(self._peers[name][1], self.codec.seal(msg))
