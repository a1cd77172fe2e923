"""The prefill side of the handoff: check a request, prefill it, stream its pages layer by layer."""
from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.admission import LocalFormat, Rejection, RejectReason, check_request
from disaggsdk.messenger.context import context_bytes, pack_context
from disaggsdk.messenger.freshness import FrameCodec
from disaggsdk.messenger.grant_keys import GrantTargets
from disaggsdk.messenger.page_digest import add_layer
from disaggsdk.messenger.peers import FrameCounters, PeerId, UnitInfo
from disaggsdk.messenger.ports import PrefillEngine, Transport
from disaggsdk.messenger.prefill_job import ChunkTrace, ContextStaging, PageRange, PrefillJob, dst_geometry, imms
from disaggsdk.messenger.span_log import SpanLog
from disaggsdk.messenger.stats import TransferTotals
from disaggsdk.messenger.streamer import LayerStreamer, StepWork
from disaggsdk.messenger.write_plan import PoolGeometry, layer_writes, pages_ready
from disaggsdk.records.span_records import RequestSpanRecords

if TYPE_CHECKING:
    from concurrent.futures import Future

    from disaggsdk.engine.hooks import StepChunkInfo
    from disaggsdk.engine.sequence import RequestOutput
    from disaggsdk.kv.pools.host_mirror import HostMirror
    from disaggsdk.plan import Plan
    from disaggsdk.transfer.descriptors import MemoryRegion, Peer, RegionDescriptor

__all__ = ["ContextStaging", "PrefillMessenger"]


class PrefillMessenger:
    """Prefill half of the messenger for one prefill unit.

    Args:
        me: this unit.
        engine: the unit's engine, mode "prefill_only" with ``return_hidden_states``.
        transfer: the unit's transfer engine.
        plan: the deployment plan.
        pool_regions: this unit's registered KV pool of each tp rank (`MemoryRegion`), in tp order.
        staging: the registered buffer outgoing context payloads are staged in.
        secret: the deployment secret.
        streaming: send layer by layer during the forward pass (False: after it).
        verify_pages: digest every byte sent and tell the decode side (``$.transport.verify_pages``).
        kv_mirror: when ``pool_regions`` are host mirrors of the engine's pools, what copies each
            layer's pages into them before they are written (`kv.pools.host_mirror`); None: the pools
            are registered themselves.
        codec: the unit's frame codec when it had one already (it changed role); None: a new one.
    """

    def __init__(self, me: UnitInfo, *, engine: PrefillEngine, transfer: Transport, plan: Plan,
                 pool_regions: Sequence[MemoryRegion], staging: ContextStaging, secret: bytes, streaming: bool = True,
                 verify_pages: bool = False, kv_mirror: HostMirror | None = None, codec: FrameCodec | None = None):
        self.me, self.engine, self.transfer, self.plan = me, engine, transfer, plan
        self.pool_regions = list(pool_regions)
        self.verify_pages = verify_pages
        self.kv_mirror = kv_mirror
        # the source bytes a page digest reads (host pools or mirrors only: the spec refuses it otherwise)
        self._pool_views = [r.view() for r in self.pool_regions] if verify_pages else []
        self.context_region, self.context_buffer = staging.region, staging.buffer
        self.secret, self.streaming = secret, streaming
        # a unit that changed role keeps its codec: its peers' replay guards saw its frame numbers so far
        self.codec = codec or FrameCodec(str(me.peer_id), secret)
        self.accepting = True  # False: the unit is changing role; new requests are refused (`stop_accepting`)
        spec, arch = plan.spec, engine.arch
        # the MTP layer's KV streams too when the deployment drafts with it (plan.kv_layers)
        self.layout, self.page_size, self.num_layers = spec.kv.layout, engine.config.page_size, plan.kv_layers
        fmt = engine.kv.cache.fmt
        self.src_geometry = PoolGeometry(fmt.num_layers, fmt.num_pages, fmt.page_bytes)
        self.context_slot_bytes = context_bytes(arch.hidden_size, arch.vocab_size)
        self.local_format = LocalFormat(spec.model, self.layout, self.page_size, spec.kv.dtype, self.context_slot_bytes)
        self._free_slots = list(range(me.num_context_slots))
        self._decodes: dict[PeerId, tuple[UnitInfo, Peer]] = {}
        self._down: set[PeerId] = set()  # decode incarnations known dead: no reply goes to them
        self._jobs: dict[str, PrefillJob] = {}  # the main thread's; a job's shared part is its `JobSends`
        self._after_forward: list[list[PageRange]] = []  # the ablation's queued step work
        self.frames, self.totals = FrameCounters(), TransferTotals()
        self.rejected: dict[str, int] = {}
        self.failed: list[tuple[str, str]] = []  # prefill failures go to the decode side, never here
        self.traced_spans: list[RequestSpanRecords] = []  # traced requests' phases here, once released
        self._open_chunks: list[tuple[SpanLog, int]] = []  # traced chunks of the step running now (main thread)
        self._streamer: LayerStreamer[PageRange] = LayerStreamer(
            engine.layer_counter, self.num_layers, self._stream_layer, self._finish_items, name=f"{me.name}-streamer")
        engine.on_step = self._on_step

    def close(self) -> None:
        """Stop the streamer thread."""
        self._streamer.close()

    # peers

    def add_peers(self, units: Sequence[UnitInfo]) -> None:
        """Learn the deployment's decode units (address book from the launcher)."""
        for info in units:
            if info.role == "decode":  # a restarted decode unit is a new PeerId: its old jobs stay dead
                self._decodes[info.peer_id] = (info, self.transfer.add_peer(info.address))

    def forget_prefixes(self) -> None:
        """Prefix caches were reset: nothing to forget here (decode units choose the prefill unit)."""

    def stop_accepting(self) -> None:
        """Refuse new prefill requests from now on (the unit changes role): decode units retry them
        elsewhere; the jobs in flight finish. `busy` turns False once the last one drained."""
        self.accepting = False

    def peer_down(self, name: str) -> None:
        """A decode unit died: stop sending its requests (they drain, then free)."""
        self._down |= {peer for peer in self._decodes if peer.name == name}
        for job in self._jobs.values():
            if job.decode.name == name:
                job.sends.abort(f"decode unit {name} went down")

    @property
    def busy(self) -> bool:
        """Whether prefills or their writes are in flight."""
        return bool(self._jobs)

    @property
    def num_waiting(self) -> int:
        """Always 0: a prefill request goes to the engine as soon as it is accepted."""
        return 0

    @property
    def open_grant_keys(self) -> int:
        """Always 0: grants are the decode side's; a prefill unit only writes into them."""
        return 0

    # control frames

    def on_frame(self, frame: bytes) -> None:
        """Handle one control frame; a bad or replayed one is counted and dropped, a bad request rejected."""
        opened = self.codec.open(frame)
        if isinstance(opened, str):
            self.frames.count(opened)
            return
        msg = opened.message
        if isinstance(msg, pr.AbortPrefill):
            job = self._jobs.get(msg.request_id)
            if job is None:
                # nothing of it is in flight here (done or never started): say so, the decode side
                # waits for this before it frees the pages
                sender = PeerId.parse(msg.decode_instance)
                peer = self._decodes.get(sender)
                if peer is None or sender in self._down:
                    self.frames.count("stale")
                    return
                drained = pr.PrefillFailed(msg.request_id, msg.generation, "aborted: nothing in flight")
                self.transfer.send(peer[1], self.codec.seal(drained))
                return
            if job.msg.generation != msg.generation:
                self.frames.count("stale")
                return
            job.sends.abort("aborted")
            return
        if not isinstance(msg, pr.PrefillRequest):
            self.frames.count("unexpected_kind")
            return
        problem = self._check(msg)
        if problem is None:
            problem = self._accept(msg)
        if problem is not None:
            key = problem.reason.value
            self.rejected[key] = self.rejected.get(key, 0) + 1
            peer = self._decodes.get(PeerId.parse(msg.decode_instance))
            if peer is not None:  # an unknown sender gets no answer (it may not be a peer at all)
                reply = pr.PrefillRejected(msg.request_id, msg.generation, str(problem))
                self.transfer.send(peer[1], self.codec.seal(reply))

    def _check(self, msg: pr.PrefillRequest) -> Rejection | None:
        decode = self._decodes.get(PeerId.parse(msg.decode_instance))
        info = decode[0] if decode else None
        num_pages = dst_geometry(self.plan, self.me.instance, info, self.num_layers).num_pages if info else 0
        problem = check_request(msg, info, num_pages, self.local_format)
        if problem is None and not self.accepting:
            problem = Rejection(RejectReason.LEAVING, f"{self.me.name} is changing role; retry elsewhere")
        if problem is None and msg.request_id in self._jobs:
            problem = Rejection(RejectReason.DUPLICATE, f"request {msg.request_id} is already being prefilled here")
        if problem is None and not self._free_slots:
            problem = Rejection(RejectReason.OVERLOADED, "no context staging slot free; retry elsewhere")
        return problem

    def _accept(self, msg: pr.PrefillRequest) -> Rejection | None:
        from disaggsdk.engine.sampling_params import SamplingParams
        from disaggsdk.errors import DisaggError

        sender = PeerId.parse(msg.decode_instance)
        info, peer = self._decodes[sender]
        try:  # the slot is taken only once the engine took the request (`_check` saw one free)
            job = PrefillJob.for_request(msg, sender, info, peer, self.plan, self.me.instance, self.num_layers,
                                         slot=self._free_slots[-1], arrived_s=time.monotonic(),
                                         secret=self.secret if self.verify_pages else None)
        except ValueError as exc:
            return Rejection(RejectReason.BAD_REGION, str(exc))
        try:
            params = SamplingParams(max_tokens=1, prompt_logprobs=msg.prompt_logprobs)
            self.engine.add_request(msg.request_id, msg.token_ids, params)
        except DisaggError as exc:
            return Rejection(RejectReason.ENGINE, str(exc))
        self._free_slots.pop()
        if msg.traced:
            job.spans = SpanLog(msg.request_id, time.time_ns())
        self._jobs[msg.request_id] = job
        return None

    # the step hooks

    def _on_step(self, chunks: list[StepChunkInfo]) -> None:
        step_id = self.engine.layer_counter.read()[0] + 1  # begin_step comes right after this hook
        items: list[PageRange] = []
        for c in chunks:
            job = self._jobs.get(c.request_id)
            if job is None or job.sends.aborted:
                continue
            job.forward_start_s = job.forward_start_s or time.monotonic()
            chunk = self._trace_chunk(job, c, len(chunks)) if job.spans is not None else None
            # writes read these pages until they drain: never let the scheduler evict them
            self.engine.kv.pin_pages(c.request_id)
            ready = pages_ready(c.start_pos, c.num_tokens, self.page_size, c.is_last_prefill_chunk)
            if ready > job.pages_queued:
                items.append(PageRange(job, job.pages_queued, ready, c.page_ids, chunk))
                job.pages_queued = ready
                job.sends.step_queued()
        if not items:
            return
        if self.streaming:
            self._streamer.put(StepWork(step_id, items))
        else:
            self._after_forward.append(items)

    def _trace_chunk(self, job: PrefillJob, c: StepChunkInfo, batch_size: int) -> ChunkTrace:
        """Open the span of a traced job's chunk (closed in `after_step`); the first one ends its queueing."""
        assert job.spans is not None, "only traced jobs"
        now_ns = time.time_ns()
        if job.num_chunks == 0:
            job.spans.add("queue", job.spans.start_ns, now_ns)
        span = job.spans.open(f"prefill chunk {job.num_chunks}", now_ns, start_pos=c.start_pos,
                              num_tokens=c.num_tokens, batch_size=batch_size)
        job.num_chunks += 1
        self._open_chunks.append((job.spans, span))
        return ChunkTrace(job.num_chunks - 1, span, now_ns)

    def after_step(self, outputs: list[RequestOutput], forward_end_s: float) -> None:
        """Call right after ``LLMEngine.step()``: ablation writes, then context of finished prefills."""
        if self._open_chunks:
            now_ns = time.time_ns()
            for spans, span in self._open_chunks:
                spans.close(span, now_ns)
            self._open_chunks = []
        for items in self._after_forward:
            for layer in range(self.num_layers):
                self._submit_layer(items, layer)
            self._finish_items(items)
        self._after_forward = []
        for out in outputs:
            job = self._jobs.get(out.request_id)
            if job is None or not out.finished:
                continue
            if out.finish_reason != "prefilled":
                self._fail(job, f"engine ended the prefill with {out.finish_reason}")
                continue
            self._send_context(job, out, forward_end_s)

    def _finish_items(self, items: list[PageRange]) -> None:
        for item in items:
            item.job.sends.step_submitted()

    def _stream_layer(self, items: list[PageRange], layer_id: int) -> None:
        """The streamer saw layer ``layer_id`` done: its compute span ends now (for traced jobs), its
        writes go. Seen, not measured inside the model: a layer done while the streamer still
        submitted the one before is seen when that submit returns."""
        now_ns = 0
        for item in items:
            if item.chunk is not None and item.job.spans is not None:
                now_ns = now_ns or time.time_ns()
                item.job.spans.add(f"layer {layer_id} compute", item.chunk.layer_start_ns, now_ns, item.chunk.span,
                                   layer=layer_id)
                item.chunk.layer_start_ns = now_ns
        self._submit_layer(items, layer_id)

    def _submit_layer(self, items: list[PageRange], layer_id: int) -> None:
        for job, first, stop, page_ids, chunk in items:
            if job.sends.aborted:
                continue
            skip = job.msg.num_cached_pages  # destinations list the pages after decode's cached ones
            start_ns = time.time_ns() if job.spans is not None else 0
            futures: list[Future[None]] = []
            try:
                if self.kv_mirror is not None:  # the layer is complete: its pages go to the registered mirror
                    self.kv_mirror.to_host(layer_id, page_ids[first:stop])
                pairs = layer_writes(job.transfers, self.layout, layer_id, self.src_geometry, job.dst_geometry,
                                     page_ids[first:stop], job.msg.destinations[0].page_ids[first - skip : stop - skip])
                for w in pairs:
                    futures += self._submit_writes(job, self.pool_regions[w.src_tp_rank], job.dst_regions[w.dst_tp_rank],
                                                   job.dst_targets[w.dst_tp_rank], w.src_offsets, w.dst_offsets,
                                                   w.lengths)
                if job.spans is not None:  # submitted -> every write of it completed locally
                    span = job.spans.open(f"layer {layer_id} transfer", start_ns, layer=layer_id,
                                          chunk=chunk.index if chunk is not None else -1,
                                          bytes=sum(sum(w.lengths) for w in pairs),
                                          writes=sum(len(w.lengths) for w in pairs), pages=stop - first)
                    job.spans.close_when_done(span, futures)
                if layer_id == self.num_layers - 1:
                    job.sends.last_layer_submitted()
                if job.digest is not None:  # after submitting: the hashing overlaps the writes
                    add_layer(job.digest, layer_id, pairs, self._pool_views, job.dst_geometry, job.grant_index)
            except Exception as exc:  # noqa: BLE001 - a failed submit fails the request, never the unit
                self._fail(job, f"submitting layer {layer_id}: {exc}")

    def _submit_writes(self, job: PrefillJob, src: MemoryRegion, dst: RegionDescriptor, targets: GrantTargets | None,
                       src_offsets: array[int], dst_offsets: array[int], lengths: array[int]) -> list[Future[None]]:
        """Submit writes from ``src`` into a decode region: one batch into the whole region, or with
        per-grant keys one batch per granted segment the writes land in. Returns each batch's
        completion."""
        from disaggsdk.transfer import WriteBatch

        batches: list[tuple[RegionDescriptor, array[int], list[array[int]]]]
        if targets is None:
            batches = [(dst, dst_offsets, [src_offsets, lengths])]
        else:
            batches = list(targets.split(dst_offsets, src_offsets, lengths))  # all or nothing: checked first
        futures = []
        for desc, dst_offs, (src_offs, lens) in batches:
            batch = WriteBatch(src, desc, src_offs, dst_offs, lens, imms(job.msg.imm, len(lens)))
            fut = self.transfer.submit(job.peer, batch)
            job.sends.track(fut, sum(lens), len(lens))
            futures.append(fut)
        return futures

    def _send_context(self, job: PrefillJob, out: RequestOutput, forward_end_s: float) -> None:
        job.forward_end_s = forward_end_s
        size = self.context_slot_bytes
        staging = self.context_buffer[job.slot * size : (job.slot + 1) * size]
        try:
            hidden, logits = out.hidden_state, out.logits
            if hidden is None or logits is None:
                raise ValueError("the engine returned no hidden state: build it with return_hidden_states=True")
            pack_context(staging, hidden.tolist(), logits.tolist(), forward_end_s, out.num_cached_tokens)
            if job.digest is not None:
                job.digest.add_context(staging)
            c = job.msg.context
            if c is None:  # admission refuses such a request: this only names the invariant
                raise ValueError("the request names no context slot")
            if job.sends.aborted:
                return
            start_ns = time.time_ns()
            futures = self._submit_writes(job, self.context_region, job.context_dst, job.context_target,
                                          array("Q", [job.slot * size]), array("Q", [c.offset_bytes]), array("Q", [size]))
            if job.spans is not None:
                job.spans.close_when_done(job.spans.open("context transfer", start_ns, bytes=size), futures)
        except Exception as exc:  # noqa: BLE001 - as a failed layer submit: the request fails, never the unit
            self._fail(job, f"sending the context: {exc}")
            return
        job.context_sent = True

    def _fail(self, job: PrefillJob, reason: str) -> None:
        job.sends.abort(reason)

    # completion

    def poll(self) -> None:
        """Release requests whose writes all completed; report failed ones once drained."""
        for rid, job in list(self._jobs.items()):
            sends = job.sends.settle()
            if sends.busy or not (job.context_sent or sends.aborted):
                continue
            del self._jobs[rid]
            self._free_slots.append(job.slot)
            if job.spans is not None:  # every write of it completed: its phases here are over
                self.traced_spans.append(job.spans.finish(time.time_ns()))
            if sends.aborted:
                self.engine.abort(rid)  # frees the pages whether or not the prefill finished
                self.totals.counters.transfer_failures += 1
                reply = pr.PrefillFailed(rid, job.msg.generation, sends.failure or "failed")
                if job.decode not in self._down:
                    self.transfer.send(job.peer, self.codec.seal(reply))
                continue
            if job.digest is not None and job.decode not in self._down:
                digest = pr.PageDigest(rid, job.msg.generation, job.digest.digest())
                self.transfer.send(job.peer, self.codec.seal(digest))
            self.engine.kv.release(rid)
            self.totals.add(job.record(rid))

