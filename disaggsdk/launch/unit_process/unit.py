"""One unit process: an engine (with its tp workers) and, unless colocated, its messenger."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback
from typing import TYPE_CHECKING

import msgspec

from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import ChannelClosed
from disaggsdk.launch.channel import FrameChannel
from disaggsdk.launch.health import EXIT_CODE, TransportWatchdog, UnitHeartbeat
from disaggsdk.launch.messages import UnitArgs
from disaggsdk.launch.progress import compile_failed_line
from disaggsdk.launch.unit_process.spans import UnitSpans

if TYPE_CHECKING:
    from disaggsdk.engine.compile_progress import CompileProgress
    from disaggsdk.engine.sequence import RequestOutput
    from disaggsdk.launch.unit_process.parts import UnitParts
    from disaggsdk.messenger.peers import UnitInfo
    from disaggsdk.messenger.ports import Messenger
    from disaggsdk.plan import Plan
    from disaggsdk.spec.types import Spec

IDLE_WAIT_S = 0.002  # how long an idle unit blocks on its launcher channel between polls
# A rank of a lock-step dp group votes with the others every round, so an idle group costs every
# rank a collective per wait: after LOCKSTEP_IDLE_VOTES idle votes (~0.2 s) its ranks poll every
# LOCKSTEP_IDLE_WAIT_S instead (r1_dp.yaml --tiny, idle: 1.26 cores of 2 before, 0.56 after, as
# with ep 1; docs/expert-parallel.md).
# A rank that gets a request wakes at once; the others join its vote within that wait, so the
# first request after a quiet spell waits at most that long more.
LOCKSTEP_IDLE_VOTES = 100
LOCKSTEP_IDLE_WAIT_S = 0.02
BUSY_WAIT_S = 0.0005  # the same while only transfers are in flight (no step to run)


def unit_main(sock: socket.socket) -> None:
    """Entry point of a unit process: ``sock`` is its end of the channel; the first frame says what it is."""
    # No parent-death signal: `LauncherLease` polls the parent instead. A PDEATHSIG reached the
    # unit's other threads too, and SIGTERM delivered to one of them (not the main thread) died
    # with SIGSEGV in the kernel's signal delivery on an AMX machine, hanging the unit in
    # libinfinipath's crash handler; polling sends no signal at all.
    conn = FrameChannel(sock, ch.TO_UNIT)
    args = conn.recv(timeout_s=60)
    if not isinstance(args, UnitArgs):
        raise RuntimeError(f"a unit's first frame must be UnitArgs, not {type(args).__name__}")
    if args.parent_pid and os.getppid() != args.parent_pid:
        os._exit(1)  # the launcher died before PDEATHSIG was armed: nobody will stop this unit
    serve_unit(conn, args)


def serve_unit(conn: FrameChannel[ch.ToUnit], args: UnitArgs) -> None:
    """Run the unit ``args`` describes over its channel to the runtime until told to stop; exits
    the process non-zero (after a `Fatal` frame) when it fails. Output goes to ``args.log_path``.
    SIGTERM, or its launcher's death, stops it as `Shutdown` does, within `UNIT_EXIT_GRACE_S`."""
    from disaggsdk.launch.unit_process.launcher_lease import LauncherLease, exit_now

    log_fd = os.open(args.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when units stop
    lease = LauncherLease(args.parent_pid or os.getppid())  # the launcher, or (Ray) the unit's actor
    lease.start()  # SIGTERM stops the unit from here on
    if args.cpu_ids:
        os.sched_setaffinity(0, args.cpu_ids)
    if args.cuda_visible_devices is not None:  # before anything here (or a tp worker it spawns) calls CUDA
        from disaggsdk.launch.cuda_devices import VISIBLE_DEVICES_ENV

        os.environ[VISIBLE_DEVICES_ENV] = args.cuda_visible_devices
    parts = None
    try:
        import torch

        from disaggsdk.launch.unit_process.parts import assemble
        from disaggsdk.plan import make_plan
        from disaggsdk.spec import parse_spec_yaml

        torch.set_num_threads(len(args.cpu_ids) if args.cpu_ids else 1)
        spec = parse_spec_yaml(args.spec_yaml)
        plan = make_plan(spec)
        if spec.device == "cuda":  # the first CUDA call, before a single weight is loaded
            from disaggsdk.launch.cuda_devices import require_cuda

            require_cuda(args.name, plan.instance(args.instance).tp)
        report = StartupReport(conn, args.name, spec.model, plan, args.instance)
        parts = assemble(args, spec, plan, on_compile=report)
        unit = Unit(args, conn, parts, stuck_after_s=spec.transport.stuck_after_s, model=spec.model, spec=spec,
                    plan=plan)
        lease.on_stop(unit.stop)
        unit.await_peers()
        heartbeat = UnitHeartbeat.for_unreachable_s(conn, spec.serve.unit_unreachable_s)
        heartbeat.start()  # from now on the runtime watches for silence (`launch.health.SilenceWatch`)
        try:
            unit.run()
        finally:
            heartbeat.stop()
    except BaseException as exc:  # noqa: BLE001 - report, then exit non-zero: the launcher shows the log tail
        from disaggsdk.launch.base import UnitCannotRun

        cannot_run = isinstance(exc, UnitCannotRun)
        if cannot_run:  # a machine unfit for the unit: the message is the whole report, not a bug's trace
            print(exc, flush=True)
        else:
            traceback.print_exc()
        try:
            conn.send(ch.Fatal(str(exc) if cannot_run else f"{args.name}: {type(exc).__name__}: {exc}",
                               cannot_run=cannot_run))
        except ChannelClosed:
            pass
        if parts is not None:
            try:
                parts.close()
            except Exception:  # noqa: BLE001 - the first failure is the one to report; this one is logged
                traceback.print_exc()
        sys.stdout.flush()
        exit_now(1)  # with the /dev/shm file a failed close (or a stop during start-up) left
    parts.close()
    print(f"{args.name}: stopped", flush=True)


class StartupReport:
    """Tells the launcher what a starting unit does (`messages.Progress`): "loading" at once, then,
    as the engine says (its ``on_compile``), "compiling" right after the weights loaded and
    "compiled" or "compile_failed" once the background compile ended, usually long after the unit
    reported ready (a failure goes to the unit's log too).

    Args:
        conn: the unit's channel to the launcher.
        name, model: the unit's name and model.
        plan, instance: where the weights one rank of the unit holds are known (`Plan.instance_memory`).
    """

    def __init__(self, conn: FrameChannel[ch.ToUnit], name: str, model: str, plan: Plan, instance: str):
        self._conn, self._name, self._model = conn, name, model
        ranks = plan.instance_memory(instance).ranks
        weight_bytes = ranks[0].weights.total if ranks else 0
        conn.send(ch.Progress(name, "loading", model=model, weight_bytes=weight_bytes))

    def __call__(self, progress: CompileProgress) -> None:
        """The engine's ``on_compile``."""
        if progress.stage == "failed":
            print(compile_failed_line(self._name, progress.error), flush=True)
        stage: ch.ProgressStage = "compile_failed" if progress.stage == "failed" else progress.stage
        try:
            self._conn.send(ch.Progress(self._name, stage, model=self._model, elapsed_s=progress.elapsed_s,
                                        detail=progress.error))
        except ChannelClosed:  # the launcher is gone: the unit stops on its own
            pass


class Unit:
    """The loop of one unit process over its assembled parts (see the module doc).

    Args:
        args: what the launcher said.
        conn: the unit's end of its channel to the launcher.
        parts: the engine, messenger and transfer engine (`launch.unit_process.parts.assemble`).
        stuck_after_s: how long the transfer engine's thread may be stuck inside libfabric before
            this unit gives up on it (`launch.health.TransportWatchdog`).
        model: the served model, whose tokenizer requests' grammars are compiled for.
    """

    def __init__(self, args: UnitArgs, conn: FrameChannel[ch.ToUnit], parts: UnitParts, *, stuck_after_s: float,
                 model: str, spec: Spec | None = None, plan: Plan | None = None):
        from disaggsdk.launch.unit_process.grammar_admission import GrammarAdmission

        self.args, self.conn, self.parts = args, conn, parts
        self.grammars = GrammarAdmission(model)  # structured requests wait there, not in the loop
        self.engine, self.messenger, self.transfer = parts.engine, parts.messenger, parts.transfer
        self.watchdog = TransportWatchdog(self.transfer, stuck_after_s) if self.transfer is not None else None
        self.spans = UnitSpans()  # the traced requests' phases here (none unless the router traces)
        self.stopping = False
        self.spec, self.plan = spec, plan  # what a role change builds the new messenger from
        self.switch_to: str | None = None  # a role asked for (`SwitchRole`), taken once nothing is in flight
        self.peers: dict[str, UnitInfo] = {}  # the live units as last heard: a new messenger learns them all

    def await_peers(self) -> None:
        """Report `Ready`, learn the other units from `Peers`, report `Started` (or stop on `Shutdown`)."""
        self.conn.send(ch.Ready(self.parts.info))
        msg = self.conn.recv()
        if isinstance(msg, ch.Shutdown):
            self.stopping = True
            return
        if not isinstance(msg, ch.Peers):
            raise RuntimeError(f"expected the launcher's Peers, got {type(msg).__name__}")
        self._add_peers(msg.units)
        self.conn.send(ch.Started(self.args.name))
        print(f"{self.args.name}: started", flush=True)

    # the loop

    def run(self) -> None:
        engine = self.engine
        # a rank of a lock-step dp group leaves with its group: it says it is stopping in the next
        # vote and every rank leaves at that vote (a rank that left alone would hang the others)
        while not (engine.group_stopped if engine.lockstep is not None else self.stopping):
            engine.stopping = self.stopping
            if engine.has_unfinished() or not engine.group_idle:  # another dp rank's work needs this one too
                wait_s = 0.0
            elif self.messenger is not None and self.messenger.busy:
                wait_s = BUSY_WAIT_S  # transfers in flight: poll often, but leave the core to others
            elif engine.lockstep is not None and engine.lockstep.idle_votes_in_a_row >= LOCKSTEP_IDLE_VOTES:
                wait_s = LOCKSTEP_IDLE_WAIT_S
            else:
                wait_s = IDLE_WAIT_S
            self._drain_parent(wait_s)
            for msg, error in self.grammars.ready():
                self._admit(msg, error)
            self._drain_frames()
            if self.messenger is not None:
                self.messenger.poll()
                self._report_failures(self.messenger)
                self._report_moves()  # a moved-in request's news before any of its tokens
                self._take_spans(self.messenger)
            engine.take_compiled_step()  # told when it ends, not at the next request (engine.background_compile)
            if engine.must_step():
                step_start_ns = time.time_ns() if self.spans else 0
                outputs = engine.step()
                if step_start_ns:
                    self.spans.step(outputs, step_start_ns, time.time_ns())
                self._emit_prompt_logprobs(outputs)  # before the KV's context leaves: the router has them first
                emitted = self.parts.after_step(outputs, time.monotonic())
                self._emit(emitted)
                if self.spans:
                    self._send_spans(emitted)
            if self.watchdog is not None and (stuck := self.watchdog.check(time.monotonic())) is not None:
                self._give_up_transport(stuck)
            if self.switch_to is not None:
                self._try_switch(self.switch_to)

    def _add_peers(self, units: list[UnitInfo]) -> None:
        self.peers.update((info.name, info) for info in units if info.name != self.args.name)
        if self.messenger is not None:
            self.messenger.add_peers(units)
        if self.watchdog is not None:
            for info in units:
                self.watchdog.know_peer(info.address, str(info.peer_id))

    def _give_up_transport(self, stuck: ch.TransportStuck) -> None:
        """Report and exit at once: closing would wait for the stuck thread forever."""
        where = f" sending to {stuck.poisoned_peer}" if stuck.poisoned_peer else ""
        print(f"{self.args.name}: transport thread stuck {stuck.stuck_s:.1f} s inside libfabric{where}; "
              "exiting to be restarted with a new endpoint", flush=True)
        try:
            self.conn.send(stuck)
        except ChannelClosed:
            pass
        sys.stdout.flush()
        os._exit(EXIT_CODE)

    def _drain_parent(self, wait_s: float) -> None:
        # a control frame or a fired counter ends the wait too: the loop handles it at once
        # instead of at its next poll (the prefill unit noticed frames up to 2 ms late)
        wake = self.transfer.wake if self.transfer is not None else None
        while self.conn.poll(wait_s, (wake.fileno(),) if wake is not None else ()):
            wait_s = 0.0
            self._handle(self.conn.recv())
        if wake is not None:
            wake.clear()

    def _drain_frames(self) -> None:
        if self.transfer is None or self.messenger is None:  # a colocated unit has neither
            return
        from disaggsdk.transfer import TransferError

        while True:
            try:
                frame = self.transfer.recv(timeout_s=0)
            except TransferError:
                return
            self.messenger.on_frame(frame)

    def _handle(self, msg: ch.ToUnit) -> None:
        from disaggsdk.errors import DisaggError

        if isinstance(msg, ch.Generate):
            if msg.traced:
                self.spans.begin(msg.request_id, time.time_ns())
            try:
                # before a decode unit's messenger holds it for KV: the engine sees it only later
                self.engine.check_prompt(msg.request_id, msg.prompt_ids, msg.params)
                if not self.grammars.hold(msg):  # a grammar is built first, off this loop
                    self._admit(msg, None)
            except DisaggError as exc:
                self.spans.drop(msg.request_id)
                self.conn.send(ch.Tokens(msg.request_id, [], True, "error", str(exc)))
        elif isinstance(msg, ch.Abort):
            if not self.grammars.abort(msg.request_id):
                self.parts.abort(msg.request_id)
            self.spans.drop(msg.request_id)
            self.conn.send(ch.Tokens(msg.request_id, [], True, "abort"))
        elif isinstance(msg, ch.PeerDown):
            self.peers.pop(msg.name, None)
            if self.messenger is not None:
                self.messenger.peer_down(msg.name)
        elif isinstance(msg, ch.PeerUp):
            self._add_peers([msg.info])
        elif isinstance(msg, ch.ResetPrefixCache):
            self.engine.kv.reset_prefix_cache()
            if self.messenger is not None:
                self.messenger.forget_prefixes()
            self.conn.send(self._stats(msg.seq, False))
        elif isinstance(msg, ch.GetStats):
            self.conn.send(self._stats(msg.seq, msg.with_recent))
        elif isinstance(msg, ch.MoveRequest):
            self._move(msg)
        elif isinstance(msg, ch.CancelMove):
            self.parts.cancel_move(msg.request_id, msg.reason)
        elif isinstance(msg, ch.SwitchRole):
            self._ask_switch(msg.role)
        elif isinstance(msg, ch.Shutdown):
            self.stopping = True

    def _move(self, msg: ch.MoveRequest) -> None:
        """Start moving a decoding request; one that cannot start is answered at once (it goes on here)."""
        from disaggsdk.errors import DisaggError

        try:
            self.parts.move(msg.request_id, msg.target)
        except DisaggError as exc:
            self.conn.send(ch.RequestMoveEnded(msg.request_id, msg.target, moved=False, reason=str(exc)))

    def _ask_switch(self, role: str) -> None:
        """Start changing role: refuse the old role's new work now, switch once nothing is in flight."""
        from disaggsdk.errors import DisaggError
        from disaggsdk.launch.unit_process.role_switch import check_switch
        from disaggsdk.messenger.prefill_side import PrefillMessenger

        if role == self.args.role:
            self.conn.send(ch.RoleChanged(self.parts.info))
            return
        try:
            check_switch(self.parts, role)
        except DisaggError as exc:
            self.conn.send(ch.RoleChangeFailed(role, str(exc)))
            return
        if isinstance(self.messenger, PrefillMessenger):
            self.messenger.stop_accepting()  # decode units retry its new requests elsewhere
        self.switch_to = role

    def _try_switch(self, role: str) -> None:
        from disaggsdk.launch.unit_process.role_switch import still_busy, switch_role

        if still_busy(self.parts) is not None or self.grammars.num_held:
            return
        assert self.spec is not None and self.plan is not None, "a unit that can switch knows its spec and plan"
        self.switch_to = None
        try:
            self.parts = switch_role(self.parts, self.args, self.spec, self.plan, role)
        except Exception as exc:
            self.conn.send(ch.RoleChangeFailed(role, f"{type(exc).__name__}: {exc}"))
            raise
        self.messenger = self.parts.messenger
        self.args = msgspec.structs.replace(self.args, role=role)
        self._add_peers(list(self.peers.values()))  # the new messenger starts with an empty address book
        print(f"{self.args.name}: serves as {role} now", flush=True)
        self.conn.send(ch.RoleChanged(self.parts.info))

    def _report_moves(self) -> None:
        moved_in, ended = self.parts.take_moves()
        for m in moved_in:
            self.conn.send(ch.RequestMovedIn(m.request_id, m.source, m.num_output_tokens, m.num_bytes))
        for e in ended:
            self.conn.send(ch.RequestMoveEnded(e.request_id, e.target, e.moved, e.reason))

    def _admit(self, msg: ch.Generate, error: str | None) -> None:
        """Start a checked request, or answer it with ``error`` (its grammar did not build)."""
        from disaggsdk.errors import DisaggError

        if error is None:
            try:
                self.parts.submit(msg.request_id, msg.prompt_ids, msg.params, msg.traced)
                return
            except DisaggError as exc:
                error = str(exc)
        self.spans.drop(msg.request_id)
        self.conn.send(ch.Tokens(msg.request_id, [], True, "error", error))

    def _emit_prompt_logprobs(self, outputs: list[RequestOutput]) -> None:
        """A prefill unit's prompt scores go to the router on their own (its tokens never do)."""
        for out in outputs:
            if out.prompt_logprobs is not None and out.finish_reason == "prefilled":
                self.conn.send(ch.PromptLogprobs(out.request_id, ch.wire_logprobs(out.prompt_logprobs)))

    def _emit(self, outputs: list[RequestOutput]) -> None:
        items = []
        for out in outputs:
            if out.new_token_ids or out.finished:
                prompt = ch.wire_logprobs(out.prompt_logprobs) if out.prompt_logprobs is not None else None
                # a generated token always has its logprobs (only a prompt's first entry is None)
                logprobs = [lp for lp in ch.wire_logprobs(out.new_logprobs) if lp is not None]
                items.append(ch.Tokens(out.request_id, list(out.new_token_ids), out.finished,
                                       out.finish_reason, error=out.error, logprobs=logprobs,
                                       prompt_logprobs=prompt, num_cached_tokens=out.num_cached_tokens,
                                       prefill_unit=self.parts.prefill_unit_of(out.request_id)))
        if len(items) > 1:
            self.conn.send(ch.TokensBatch(items))
        elif items:
            self.conn.send(items[0])

    def _send_spans(self, outputs: list[RequestOutput]) -> None:
        """Send the spans of the traced requests that finished (after their tokens: a client never
        waits for a trace)."""
        for out in outputs:
            record = self.spans.finish(out.request_id, time.time_ns()) if out.finished else None
            if record is not None:
                self.conn.send(ch.RequestSpans(self.args.name, self.args.role, record))

    def _report_failures(self, messenger: Messenger) -> None:
        failed = messenger.failed
        while failed:
            rid, message = failed.pop()
            self.spans.drop(rid)
            self.conn.send(ch.Tokens(rid, [], True, "error", message))

    def _take_spans(self, messenger: Messenger) -> None:
        """A prefill unit's records of traced requests go to the router as they are; a decode unit's
        handoff records open its own (`UnitSpans.merge`), or go nowhere once the request was dropped."""
        records = messenger.traced_spans
        while records:
            record = records.pop()
            if not self.spans.merge(record) and self.args.role == "prefill":
                self.conn.send(ch.RequestSpans(self.args.name, self.args.role, record))

    def _stats(self, seq: int, with_recent: bool) -> ch.UnitStats:
        e, m = self.engine, self.messenger
        # the messenger's counters as it counted them, with the engine's own filled in
        counters = e.counters(m.totals.counters if m is not None else None)
        if m is not None:
            counters.rejected_frames, counters.rejected_requests = dict(m.frames.by_reason), dict(m.rejected)
        waiting = len(e.scheduler.waiting) + (m.num_waiting if m is not None else 0)
        return ch.UnitStats(
            seq=seq, name=self.args.name, role=self.args.role, running=len(e.scheduler.running), waiting=waiting,
            num_free_pages=e.kv.num_free_pages, num_pages=e.kv.num_pages, counters=counters,
            recent=list(m.totals.recent) if m is not None and with_recent else [],
            open_grant_keys=m.open_grant_keys if m is not None else 0,
            open_counters=self.transfer.num_open_counters if self.transfer is not None else 0)

    def stop(self) -> None:
        """End the loop after its current round, as `Shutdown` does (SIGTERM, a dead launcher).
        Only sets a flag: it runs in a signal handler or in `LauncherLease`'s thread."""
        self.stopping = True

    def close(self) -> None:
        """Stop the messenger, the tp workers and the transfer engine; unmap the pools."""
        self.grammars.close()
        self.parts.close()
