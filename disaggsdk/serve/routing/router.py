"""The router: a `ServingBackend` over a `Runtime` — which unit serves a request, and its events."""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import LaunchError, Runtime, UnitDown, UnitStalled, UnitUnreachable
from disaggsdk.models import resolve_model
from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.serve.backend import LaunchedUnits, TokenEvent
from disaggsdk.serve.model_tokenizer import ModelTokenizer
from disaggsdk.serve.moves.request_moves import DrainReport, LeverConflict, Move, MoveError, MoveOutcome, RequestMoves
from disaggsdk.serve.routing.first_token_clock import FirstTokenClock
from disaggsdk.serve.routing.poison_requests import PoisonRequests, RefusedRequestError, fingerprint
from disaggsdk.serve.routing.prompt_logprobs_join import PromptLogprobsJoin
from disaggsdk.serve.routing.request_state import RequestBook, RequestState
from disaggsdk.serve.routing.unit_gauges import instance_stats
from disaggsdk.serve.routing.unit_routability import NoRoutableUnitError, UnitRoutability
from disaggsdk.serve.routing.unit_routing import SERVING_ROLES, UnitRouting
from disaggsdk.serve.routing.unit_stats_replies import UnitStatsReplies
from disaggsdk.spec.rules import max_model_len

if TYPE_CHECKING:
    from disaggsdk.engine.tokenizer import Tokenizer
    from disaggsdk.report.ttft_phases import PhaseSummary
    from disaggsdk.report.waterfall import TimelineSpan
    from disaggsdk.serve.tracing.request_tracing import RequestTracing
    from disaggsdk.spec import Spec


class Router:
    """Serve a runtime's units as one `ServingBackend`.

    Args:
        runtime: started units (`disaggsdk.launch.start_local_runtime` or another `Runtime`); the router
            owns it from now on and closes it in `close()`.
        tracing: trace every request across the units (`serve.tracing.request_tracing`, made by
            `serve.tracing.tracing_switch.request_tracing_for`); None: off, units record nothing.
    """

    supports_logprobs = True

    def __init__(self, runtime: Runtime, tracing: RequestTracing | None = None):
        self.runtime = runtime
        self.tracing = tracing
        self.spec: Spec = runtime.spec
        self.model_name = runtime.model_name
        self.max_model_len = max_model_len(self.spec, resolve_model(self.spec.model))  # checked at the HTTP edge
        self._roles = runtime.unit_roles()
        self.routing = UnitRouting.from_spec(self.spec)  # guarded by _lock
        self._lock = threading.Lock()
        self._closed = False
        self._requests = RequestBook(list(self._roles))  # each request in flight, one record (guarded by _lock)
        self._poison = PoisonRequests()
        self._seq = itertools.count(1)
        self._stats = UnitStatsReplies(runtime)
        self._tokenizer = ModelTokenizer(self.spec.model, self.max_model_len)
        self.first_tokens = FirstTokenClock()  # guarded by _lock
        self._join = PromptLogprobsJoin()  # prompt scores from prefill units + decode units' tokens
        self._moves = RequestMoves()  # decoding requests moving between decode units (guarded by _lock)
        self._role_changes: dict[str, Future[str]] = {}  # unit -> its SwitchRole's answer ("": done; guarded by _lock)
        self.rebalancing = threading.Lock()  # held by `serve.moves.rebalance` while it runs: one at a time
        runtime.listen(self._on_message, self._on_unit_down)
        self.unit_stats()  # so stats() has a first snapshot to give

    # messages from the runtime's reader thread

    def _on_message(self, unit: str, msg: ch.FromUnit | UnitStalled | UnitUnreachable) -> None:
        if isinstance(msg, ch.Tokens):
            self._on_tokens(unit, msg)
        elif isinstance(msg, ch.TokensBatch):
            for item in msg.items:
                self._on_tokens(unit, item)
        elif isinstance(msg, ch.PromptLogprobs):
            self._deliver(self._join.scores(msg.request_id, ch.engine_logprobs(msg.logprobs)))
        elif isinstance(msg, ch.RequestMovedIn):
            self._on_moved_in(unit, msg)
        elif isinstance(msg, ch.RequestMoveEnded):
            self._on_move_ended(unit, msg)
        elif isinstance(msg, (ch.RoleChanged, ch.RoleChangeFailed)):
            self._on_role_answer(unit, msg)
        elif isinstance(msg, ch.UnitStats):
            self._stats.received(msg)
        elif isinstance(msg, ch.RequestSpans):
            if self.tracing is not None:
                self.tracing.unit_spans(msg)
        elif isinstance(msg, UnitStalled):
            self._on_unit_stalled(unit)
        elif isinstance(msg, UnitUnreachable):
            self._on_unit_unreachable(unit, msg.silent_s)

    def _on_tokens(self, unit: str, msg: ch.Tokens) -> None:
        prompt = ch.engine_logprobs(msg.prompt_logprobs) if msg.prompt_logprobs is not None else None
        scores = [lp for lp in ch.engine_logprobs(msg.logprobs) if lp is not None]  # a token's never is
        event = TokenEvent(msg.request_id, msg.token_ids, msg.finished, msg.finish_reason,
                           scores, error=msg.error, instance=unit, prompt_logprobs=prompt,
                           num_cached_tokens=msg.num_cached_tokens, prefill_instance=msg.prefill_unit)
        with self._lock:
            move = self._moves.get(msg.request_id)
            if move is not None and unit == move.target:
                if move.moved_in and not move.target_down:
                    move.held.append(msg)  # delivered once the source's last tokens were read
                return
            state = self._requests.get(msg.request_id)
            if state is None or state.unit != unit:
                return  # moved off this unit while it was stalled (its abort answer too), or finished
            first, state.start = not state.started, None
            self.first_tokens.answered(msg.request_id, time.monotonic(), bool(msg.token_ids))
        if self.tracing is not None and first:
            self.tracing.first_token(msg.request_id, unit, msg.prefill_unit)
        self._deliver(self._join.event(event))

    def _deliver(self, events: list[TokenEvent]) -> None:
        """Hand events to their requests' sinks; a finished one ends its request here."""
        for event in events:
            rid = event.request_id
            with self._lock:
                state = self._requests.pop(rid) if event.finished else self._requests.get(rid)
            if state is not None:
                state.sink(event)
            if event.finished and self.tracing is not None:
                self.tracing.finish(rid, event.finish_reason, event.error)

    # moving decoding requests between decode units (`request_moves`)

    def move(self, request_id: str, target: str) -> Future[MoveOutcome]:
        """Move a decoding request, with its KV, to decode unit ``target``; it continues there with the
        tokens it would have had. The future resolves when the move ended (moved or not: a request that
        did not move goes on where it was). ``request_id``: its key, its response id or the client's
        ``X-Request-Id`` (`resolve_request_id`).

        Raises:
            MoveError: the request is not in flight, has no token yet, is moving already, or
                ``target`` is not another decode unit.
            LeverConflict: ``target`` is down or drained (routing would not pick it either).
        """
        asked = request_id  # what errors name it by: its key never leaves the server (`client_request_ids`)
        request_id = self.resolve_request_id(request_id) or request_id  # unknown: "not in flight" below
        with self._lock:
            state = self._requests.get(request_id)
            source = state.unit if state is not None else None
            if state is None or source is None:
                raise MoveError(f"request {asked!r} is not in flight")
            if self._moves.get(request_id) is not None:
                raise MoveError(f"request {asked!r} is moving already")
            if not state.started:
                raise MoveError(f"request {asked!r} has not started decoding yet: its KV is still coming")
            if self._roles.get(source) != "decode":
                raise MoveError(f"request {asked!r} is on {source} ({self._roles.get(source)}): only requests "
                                "on decode units move")
            decode = sorted(n for n, r in self._roles.items() if r == "decode" and n != source)
            if target == source:
                raise MoveError(f"{target!r} is not another healthy decode unit: request {request_id!r} decodes "
                                f"there already (other decode units: {', '.join(decode) or 'none'})")
            if target not in decode:
                raise MoveError(f"{target!r} is not another healthy decode unit (decode units: {', '.join(decode)})")
            routability = self._routability()
            if not routability.is_routable(target):
                raise LeverConflict(f"{target!r} is not another healthy decode unit now: {routability.why_not(target)}; "
                                    f"routable decode units: {', '.join(routability.routable('decode')) or 'none'}")
            move = self._moves.start(request_id, source, target)
        if not self.runtime.send(source, ch.MoveRequest(request_id, target)):
            with self._lock:
                self._moves.pop(request_id)
            move.end(False, f"{source} cannot be reached")
        return move.outcome

    def drain(self, unit: str, timeout_s: float = 60.0) -> DrainReport:
        """Take decode unit ``unit`` out of routing and move every request it decodes to the other
        decode units (the least loaded first); requests still waiting for their KV there move once
        they decode. Returns once it holds nothing, or at ``timeout_s``, what moved and what is still
        there. A unit that drained stays out of routing until `undrain`; one that did not is routed
        again (as it was before the call), so a failed drain never leaves requests without a unit.

        Raises:
            MoveError: ``unit`` is not a decode unit.
            LeverConflict: it is the last routable decode unit (the others are down or drained), or
                the other decode units went away while its requests waited to move.
        """
        with self._lock:
            if self._roles.get(unit) != "decode":
                raise MoveError(f"{unit!r} is not a decode unit (decode units: "
                                f"{', '.join(sorted(n for n, r in self._roles.items() if r == 'decode'))})")
            refusal = self._routability().role_refusal("decode", leaving=unit)
            if refusal is not None and unit not in self._moves.draining:
                raise LeverConflict(f"draining {unit} would leave nothing to decode: {refusal}; undrain or "
                                    "restart another decode unit first")
            was_draining = unit in self._moves.draining
            self._moves.draining.add(unit)
        try:
            report = self._drain(unit, timeout_s)
        except BaseException:
            self._undo_drain(unit, was_draining)
            raise
        if not report.drained:
            self._undo_drain(unit, was_draining)
        return DrainReport(unit, report.moves, report.remaining, routed=not report.drained and not was_draining)

    def _undo_drain(self, unit: str, was_draining: bool) -> None:
        with self._lock:
            if not was_draining and self._roles.get(unit) == "decode":
                self._moves.draining.discard(unit)

    def _drain(self, unit: str, timeout_s: float) -> DrainReport:
        """`drain`'s moves, with ``unit`` out of routing already."""
        outcomes: list[MoveOutcome] = []
        pending: list[Future[MoveOutcome]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                held = self._requests.held_by(unit)
                startable = [r for r in held if self._started(r) and self._moves.get(r) is None]
                targets = [n for n, r in self._roles.items() if r == "decode" and n != unit
                           and n not in self._moves.draining and self.runtime.is_healthy(n)]
                load = {n: self._requests.num_held(n) for n in targets}
            if not held and not pending:
                break
            if startable and not targets:
                raise LeverConflict(f"no other routable decode unit can take the requests of {unit}: "
                                    f"{self.routability().role_refusal('decode', leaving=unit)}")
            for rid in startable:
                target = min(targets, key=lambda n: (load[n], n))
                load[target] += 1
                try:
                    pending.append(self.move(rid, target))
                except MoveError:
                    continue  # it ended or started moving meanwhile: the next round sees
            done = [f for f in pending if f.done()]
            outcomes += [f.result() for f in done]
            pending = [f for f in pending if not f.done()]
            time.sleep(0.02)
        with self._lock:
            remaining = sorted(self._requests.held_by(unit))
        return DrainReport(unit, outcomes, remaining)

    @property
    def closed(self) -> bool:
        """Whether `close` ran: no request is served any more."""
        return self._closed

    def resolve_request_id(self, public_id: str) -> str | None:
        """The key of the request in flight that a client knows as ``public_id``: its key itself, its
        response id (``cmpl-...``), or the ``X-Request-Id`` it sent (`client_request_ids`); None: none."""
        names = [public_id, f"cmpl-{public_id}", f"chatcmpl-{public_id}"]
        with self._lock:
            if public_id in self._requests:
                return public_id
            for key in self._requests.ids():
                for name in names:  # the server appends "-" and 32 hex digits of its own to a response id
                    tail = key[len(name) + 1:]
                    if key.startswith(name + "-") and len(tail) == 32 and all(c in "0123456789abcdef" for c in tail):
                        return key
        return None

    def unit_roles(self) -> dict[str, str]:
        """Each unit's role ("prefill", "decode", "mixed"), by name."""
        with self._lock:
            return dict(self._roles)

    def routability(self) -> UnitRoutability:
        """Which units routing may pick now, and why a role has none (`serve.routing.unit_routability`)."""
        with self._lock:
            return self._routability()

    def _routability(self) -> UnitRoutability:
        """`routability`, under the lock."""
        return UnitRoutability(dict(self._roles), frozenset(n for n in self._roles if self.runtime.is_healthy(n)),
                               frozenset(self._moves.draining))

    def num_waiting_past(self, age_s: float, since_s: float = 0.0) -> int:
        """Requests in flight received at or after ``since_s`` (``time.monotonic()``) still without a
        first token ``age_s`` seconds on: the TTFT misses a queue holds before they finish."""
        now_s = time.monotonic()
        with self._lock:
            ages = [now_s - t for rid in self._requests.ids() if not self._started(rid)
                    and (t := self.first_tokens.received_at(rid)) is not None and t >= since_s]
        return sum(age > age_s for age in ages)

    def num_in_flight(self, unit: str) -> int:
        """Requests ``unit`` holds now."""
        with self._lock:
            return self._requests.num_held(unit)

    def unit_of(self, request_id: str) -> str | None:
        """The unit that holds request ``request_id`` (its key) now; None: it is not in flight, or
        between units."""
        with self._lock:
            state = self._requests.get(request_id)
            return state.unit if state is not None else None

    def _started(self, request_id: str) -> bool:
        """Under the lock: whether a request in flight has had its first token."""
        state = self._requests.get(request_id)
        return state is not None and state.started

    def switch_role(self, unit: str, role: str) -> Future[str]:
        """Ask ``unit`` to serve ``role`` once nothing of its current role is in flight (`launch.unit_process.role_switch`);
        a decode unit should be drained first. The future resolves to "" once it serves ``role``, or to
        why it cannot (it goes on in its role). A unit that turned decode is not routed until `undrain`:
        call it once every unit heard of the change (`unit_stats` answers after it).

        Raises:
            MoveError: an unknown unit, or a switch already asked of it.
        """
        with self._lock:
            if unit not in self._roles:
                raise MoveError(f"no unit {unit!r} in this deployment (units: {', '.join(sorted(self._roles))})")
            if unit in self._role_changes:
                raise MoveError(f"{unit} is changing role already")
            answer: Future[str] = Future()
            self._role_changes[unit] = answer
        if not self.runtime.send(unit, ch.SwitchRole(role)):
            with self._lock:
                self._role_changes.pop(unit, None)
            answer.set_result(f"{unit} cannot be reached")
        return answer

    def _on_role_answer(self, unit: str, msg: ch.RoleChanged | ch.RoleChangeFailed) -> None:
        with self._lock:
            answer = self._role_changes.pop(unit, None)
            if isinstance(msg, ch.RoleChanged):
                self._roles[unit] = msg.info.role
                self.routing.forget(unit)  # what it cached as a decode unit is not what it will be sent
                # a unit that turned decode is routed only once every unit heard of it (`undrain` after a
                # barrier: the prefill units must know it before it asks them); one that left decode is not routed
                if msg.info.role == "decode":
                    self._moves.draining.add(unit)
                else:
                    self._moves.draining.discard(unit)
        if answer is not None:
            answer.set_result("" if isinstance(msg, ch.RoleChanged) else msg.reason)

    def undrain(self, unit: str) -> None:
        """Let routing pick ``unit`` again after `drain`."""
        with self._lock:
            self._moves.draining.discard(unit)

    def _on_moved_in(self, unit: str, msg: ch.RequestMovedIn) -> None:
        with self._lock:
            move = self._moves.get(msg.request_id)
            expected = move is not None and move.target == unit and msg.request_id in self._requests
            if move is not None and expected:
                move.moved_in, move.num_bytes, move.num_output_tokens = True, msg.num_bytes, msg.num_output_tokens
                if move.source_ended:  # the source's end was read first (two channels): the move is done
                    self._moves.pop(msg.request_id)
        if move is not None and expected and move.source_ended:
            move.end(True)
        if not expected:  # nobody waits for it here any more (it ended meanwhile): the target drops it
            self.runtime.send(unit, ch.Abort(msg.request_id))

    def _on_move_ended(self, unit: str, msg: ch.RequestMoveEnded) -> None:
        rid = msg.request_id
        error = None
        with self._lock:
            move = self._moves.get(rid)
            if move is None or move.source != unit:
                return
            held: list[ch.Tokens] = []
            waiting = msg.moved and not move.target_down and not move.moved_in
            if waiting:
                # the target's `RequestMovedIn` is on its way on its own channel (it was sent before the
                # source heard of the admission): the request is the target's now; its news closes the move
                move.source_ended = True
            else:
                self._moves.pop(rid)
            state = self._requests.get(rid)
            if msg.moved and move.target_down:
                error = f"request moved from {unit} to {move.target}, which then {move.target_fate}; retry the request"
                self._leave(state, rid, unit)
            elif msg.moved:
                if state is not None:
                    self._requests.place(state, rid, move.target)
                held = move.held
        if waiting:
            return
        move.end(msg.moved and error is None, error or msg.reason)
        for tokens in held:
            self._on_tokens(move.target, tokens)
        if error is not None:
            self._end_with_error(rid, move.target, error)

    def _moves_at_unit_down(self, unit: str) -> tuple[list[Move], list[Move]]:
        """Under the lock: the moves ``unit``'s death settles. A move from it whose target admitted the
        request goes on there (its KV landed whole); one from it that had not is ended (the request
        ends with the unit's other requests, the target is told to drop it); a move to it is off (the
        source, told by `PeerDown`, resumes what it never let go of). Returns (continued, dropped)."""
        continued, dropped = [], []
        for move in self._moves.from_(unit):
            if move.source_ended:  # it had let go already: the request is the target's, whose news closes it
                continue
            self._moves.pop(move.request_id)
            if move.moved_in and not move.target_down:
                state = self._requests.get(move.request_id)
                if state is not None:
                    self._requests.place(state, move.request_id, move.target)
                continued.append(move)
            else:
                dropped.append(move)
        for move in self._moves.to(unit):
            if move.source_ended:  # the source let go: the request was the target's, and dies with it
                self._moves.pop(move.request_id)
                dropped.append(move)
                continue
            move.target_down = True
            move.held.clear()
            self._leave(self._requests.get(move.request_id), move.request_id, unit)
        return continued, dropped

    def _leave(self, state: RequestState | None, request_id: str, unit: str) -> None:
        """Under the lock: ``unit`` holds the request no more (if it held it)."""
        if state is not None and state.unit == unit:
            self._requests.place(state, request_id, None)

    def _on_unit_down(self, unit: str, down: UnitDown) -> None:
        with self._lock:
            continued, dropped = self._moves_at_unit_down(unit)
            role_change = self._role_changes.pop(unit, None)
        if role_change is not None:
            role_change.set_result(f"{unit} died before it changed role")
        with self._lock:
            held = self._requests.held_by(unit)
            states = {rid: state for rid in held if (state := self._requests.get(rid)) is not None}
            for rid, state in states.items():
                self._requests.place(state, rid, None)
            self.routing.forget(unit)  # what it cached goes with it
            # each waiting request's fingerprint counts this death once, however many copies waited;
            # a unit stopped only because its lock-step group lost a rank did not die of what it held
            waiting = [] if down.collateral else [rid for rid, state in states.items() if not state.started]
            deaths = {fp: self._poison.unit_died_holding(fp) for fp in {states[r].fingerprint for r in waiting}}
            # A waiting request is poison once units died holding it max_unit_deaths times, or at its
            # first death when its client sent poison before; its client is counted once per request.
            poison: dict[str, int] = {}
            suspects = {c for c in {states[r].client for r in waiting} if self._poison.poison_sent_by(c)}
            for fp, client in {(states[r].fingerprint, states[r].client) for r in waiting}:
                if deaths[fp] >= self._poison.max_unit_deaths or client in suspects:
                    self._poison.sent_poison(client)
            for rid in waiting:
                fp_deaths = deaths[states[rid].fingerprint]
                if fp_deaths >= self._poison.max_unit_deaths or states[rid].client in suspects:
                    poison[rid] = fp_deaths
        for move in continued:
            move.end(True)
            for tokens in move.held:
                self._on_tokens(move.target, tokens)
        for move in dropped:
            if move.target != unit:
                self.runtime.send(move.target, ch.Abort(move.request_id))
            move.end(False, f"{unit} died before {move.target} had the request's KV" if move.target != unit
                     else f"{unit} died holding the request it had taken over")
        for rid in held:
            if rid in poison:
                self._end_with_error(rid, unit, self._poison.refusal(poison[rid]))
            elif not self._resubmit(rid):
                self._end_with_error(rid, unit, f"unit {unit} died; retry the request")
        self._stats.unit_down(unit)

    def _end_with_error(self, request_id: str, unit: str, error: str) -> None:
        """End a request that ``unit`` held (and holds no more) with ``error``."""
        self._join.forget(request_id)
        with self._lock:
            state = self._requests.pop(request_id)
        if state is not None:
            state.sink(TokenEvent(request_id, [], True, "error", error=error, instance=unit))
        if self.tracing is not None:
            self.tracing.finish(request_id, "error", error)

    def _on_unit_stalled(self, unit: str) -> None:
        """Move the requests waiting on a stalled unit for their first token (once, as from a dead
        unit), and abort them there; those streaming stay (their tokens resume if it wakes)."""
        with self._lock:
            waiting = [rid for rid in self._requests.held_by(unit) if not self._started(rid)]
        for rid in waiting:
            if self._resubmit(rid, leaving=unit):
                self.runtime.send(unit, ch.Abort(rid))

    def _on_unit_unreachable(self, unit: str, silent_s: float) -> None:
        """Move the requests waiting on an unreachable unit for their first token (once, as from a
        dead unit) and end the others with a retryable error: their tokens cannot reach their clients
        until the unit is heard again, which may be never. Each gets an abort, sent now, that the unit
        reads when it is reached again (a cut link's socket holds it), so its pages come back.

        A move to it is called off now, not at the source's deadline: the source is told to resume the
        request (`CancelMove`) and says how the move ended. A move from it ends with its request."""
        why = f"{unit} is unreachable: nothing heard from it for {silent_s:.1f} s (serve.unit_unreachable_s)"
        with self._lock:
            held = self._requests.held_by(unit)
            cancel = [m for m in self._moves.to(unit) if not m.source_ended]
            for move in cancel:  # should the source say it let go after all, the request ends: see _on_move_ended
                move.target_down, move.target_fate = True, "became unreachable"
                move.held.clear()
            # the source let go (the request is the target's, ended below) or the source is this unit
            ended = [m for m in [*self._moves.to(unit), *self._moves.from_(unit)] if m not in cancel]
            for move in ended:
                self._moves.pop(move.request_id)
        for move in cancel:
            self.runtime.send(move.source, ch.CancelMove(move.request_id, why))
        for move in ended:
            move.end(False, why)
        for rid in held:
            if not self._resubmit(rid, leaving=unit):
                self._end_with_error(rid, unit, f"unit {why}; retry the request")
            self.runtime.send(unit, ch.Abort(rid))

    def _resubmit(self, request_id: str, leaving: str | None = None) -> bool:
        """Send a request that lost its unit before its first token to another live unit, once.

        Args:
            leaving: the unit it leaves when that unit still lives (stalled or unreachable); None: it died.
        """
        with self._lock:
            state = self._requests.get(request_id)
            if state is None or state.start is None or state.resubmitted:
                return False
            start = state.start
            unit = self._pick_unit(self.routing.hashes(start[0]))
            if unit is None or unit == leaving:
                return False
            state.resubmitted = True
            self._requests.place(state, request_id, unit)
        if self.runtime.send(unit, ch.Generate(request_id, *start, traced=state.traced)):
            return True
        with self._lock:
            if self._requests.get(request_id) is state:  # not ended meanwhile
                self._requests.place(state, request_id, leaving)
        return False

    def _pick_unit(self, hashes: list[bytes]) -> str | None:
        serving = [n for n, role in self._roles.items()
                   if role in SERVING_ROLES and self.runtime.is_healthy(n) and n not in self._moves.draining]
        return self.routing.pick(serving, hashes, {n: self._requests.num_held(n) for n in serving})

    def compile_stages(self) -> dict[str, str | None]:
        """Each unit's step compile as it last said (`Runtime.compile_stages`)."""
        return self.runtime.compile_stages()

    def wait_until_compiled(self, timeout_s: float) -> dict[str, str | None]:
        """Block until no unit still compiles its step in the background (or ``timeout_s`` passed), so
        that what is measured next is the compiled step; each unit's stage (`Runtime.compile_stages`)."""
        return self.runtime.wait_until_compiled(timeout_s)

    def unrecoverable(self) -> str | None:
        """Why no request can be served again (every decode unit dead, no restart left), or None."""
        serving = [n for n, role in self._roles.items() if role in SERVING_ROLES]
        if any(self.runtime.may_recover(n) for n in serving):
            return None
        return (f"every decode unit ({', '.join(serving)}) died and none can be restarted; "
                f"their logs are named in the reports above")

    # ServingBackend

    def units(self) -> LaunchedUnits:
        """This router: it offers everything of launched units (`LaunchedUnits`)."""
        return self

    def tokenizer_or_none(self) -> Tokenizer | None:
        """The model's tokenizer, or None when the model has none."""
        return self._tokenizer.get_or_none()

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (with BOS) under the model's tokenizer.

        Raises:
            PromptTooLong: ``text`` holds more than `max_model_len` tokens for certain.
        """
        return self._tokenizer.encode(text)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids`` (without special tokens unless asked)."""
        return self._tokenizer.decode(token_ids, skip_special_tokens)

    def submit(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams,
               sink: Callable[[TokenEvent], None], client: str = "",
               trace_context: Mapping[str, str] | None = None, response_id: str = "") -> str:
        """Send a request to the serving unit `serve.routing` picks; ``sink`` gets its events (reader thread).

        Args:
            client: who sent it (the HTTP edge gives the client's address), for `poison_requests`;
                "" for a caller in this process.
            trace_context: the client's W3C trace-context headers (``traceparent``, ``tracestate``):
                with tracing on, the request's trace continues the client's.
            response_id: the id the client knows the request by (`ServingBackend.generate`): its trace's name.

        Returns:
            The unit's name.
        Raises:
            LaunchError: the router is closed, or the id is in use.
            NoRoutableUnitError: no serving unit is routable (each is down or drained): a 503 with Retry-After.
            RefusedRequestError: units died holding an identical request, or requests of ``client`` took
                units down too often (`poison_requests`).
        """
        hashes = self.routing.hashes(prompt_ids)  # before the lock: a long prompt takes milliseconds
        fp = fingerprint(prompt_ids, params)
        # (a duplicate id is refused below: `RequestTracing.start` leaves the trace of the request holding it be)
        traced = self.tracing is not None and self.tracing.start(request_id, trace_context, len(prompt_ids), response_id)
        route_start_ns = time.time_ns() if traced else 0
        try:
            unit = self._admit(request_id, prompt_ids, params, sink, client, hashes, fp, traced)
        except BaseException:
            if traced and self.tracing is not None:
                self.tracing.finish(request_id, "error", "refused")
            raise
        if traced and self.tracing is not None:
            self.tracing.routed(request_id, unit, route_start_ns, time.time_ns())
        try:
            delivered = self.runtime.send(unit, ch.Generate(request_id, list(prompt_ids), params, traced=traced))
        except Exception as exc:  # cannot even be encoded (an int over 64 bits): never leave it in flight
            with self._lock:
                self._requests.pop(request_id)
            if traced and self.tracing is not None:
                self.tracing.finish(request_id, "error", str(exc))
            raise LaunchError(f"request {request_id!r} cannot be sent to a unit: {exc}") from exc
        if not delivered:
            self._on_unit_down(unit, UnitDown(""))  # died between the choice and the send: end what it held
        return unit

    def _admit(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams,
               sink: Callable[[TokenEvent], None], client: str, hashes: list[bytes], fp: bytes | None,
               traced: bool) -> str:
        """Pick the request's unit and hold it in flight there (`submit` sends it); returns the unit."""
        with self._lock:
            if self._closed:
                raise LaunchError("the runtime is closed; start a new one")
            if request_id in self._requests:
                raise LaunchError(f"request id {request_id!r} is in flight; use a fresh id")
            if self._poison.is_poison(fp):
                raise RefusedRequestError(self._poison.refusal(self._poison.deaths(fp)))
            barred = self._poison.client_refusal(client)
            if barred is not None:
                raise RefusedRequestError(barred)
            unit = self._pick_unit(hashes)
            if unit is None:
                raise NoRoutableUnitError(self._routability().no_serving_unit())
            self._requests.add(request_id, RequestState(sink, fp, client, traced, (list(prompt_ids), params)), unit)
            self.first_tokens.received(request_id, time.monotonic())
            self._join.expect(request_id, params)
        return unit

    async def generate(self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams,
                       client: str = "", trace_context: Mapping[str, str] | None = None, response_id: str = ""
                       ) -> AsyncGenerator[TokenEvent, None]:
        """Stream a request's tokens (errors arrive as a final event with finish_reason "error");
        ``client``, ``trace_context`` and ``response_id`` as in `submit`."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()

        def sink(ev: TokenEvent) -> None:  # on the runtime's reader thread
            loop.call_soon_threadsafe(events.put_nowait, ev)

        try:
            self.submit(request_id, prompt_ids, params, sink, client, trace_context, response_id)
        except NoRoutableUnitError as exc:
            yield TokenEvent(request_id, [], True, "error", error=str(exc), retry_after_s=exc.retry_after_s)
            return
        except LaunchError as exc:
            yield TokenEvent(request_id, [], True, "error", error=str(exc))
            return
        while True:
            ev = await events.get()
            yield ev
            if ev.finished:
                return

    async def abort(self, request_id: str) -> None:
        """Stop a request; its pages are freed by its unit once no write can land."""
        self.abort_sync(request_id)

    def abort_sync(self, request_id: str) -> None:
        """`abort` for callers without an event loop."""
        with self._lock:
            state = self._requests.get(request_id)
            owners = [state.unit] if state is not None and state.unit is not None else []
            move = self._moves.get(request_id)
            if move is not None and move.target not in owners:
                owners.append(move.target)  # it may be decoding there already
        for owner in owners:
            self.runtime.send(owner, ch.Abort(request_id))

    def generate_batch(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                       timeout_s: float = 300.0, prefix: str = "batch") -> list[list[TokenEvent]]:
        """Run prompts concurrently to completion, for callers without an event loop; returns every
        request's events in order.

        Args:
            params: one `SamplingParams` for all prompts, or one per prompt.
        Raises:
            LaunchError: a request did not finish within ``timeout_s``.
        """
        ids = [f"{prefix}-{next(self._seq)}-{i}" for i in range(len(prompts))]
        params_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        done: queue.Queue[str] = queue.Queue()
        events: dict[str, list[TokenEvent]] = {}

        def sink_for(rid: str) -> Callable[[TokenEvent], None]:
            def sink(ev: TokenEvent) -> None:
                events.setdefault(rid, []).append(ev)
                if ev.finished:
                    done.put(rid)
            return sink

        for rid, prompt, p in zip(ids, prompts, params_list):
            self.submit(rid, prompt, p, sink_for(rid))
        deadline = time.monotonic() + timeout_s
        finished: set[str] = set()
        while len(finished) < len(ids):
            try:
                finished.add(done.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise LaunchError(f"{len(ids) - len(finished)} requests did not finish in {timeout_s} s") from None
        return [events[rid] for rid in ids]

    def ttft_phases(self, since_s: float = 0.0) -> PhaseSummary:
        """Where the time to first token of requests received since ``since_s`` (`time.monotonic()`)
        went, phase by phase (`report.ttft_phases.summarize_phases`)."""
        from disaggsdk.report.ttft_phases import summarize_phases

        with self._lock:
            first_tokens = [r for r in self.first_tokens.records() if r[1] >= since_s]
        records = [r for s in self.unit_stats().values() for r in s.recent]
        return summarize_phases(first_tokens, records)

    def trace(self, request_id: str) -> list[TimelineSpan]:
        """The finished spans of a recent traced request (`serve.tracing.request_tracing`), by exactly the response
        id its client got or the X-Request-Id its answer carried (a request submitted in this process
        without one: by its id); [] when tracing is off or the request is not held."""
        if self.tracing is None:
            return []
        from disaggsdk.serve.tracing.request_tracing import timeline_spans

        return timeline_spans(self.tracing.spans_of(request_id))

    def placement(self) -> dict[str, str]:
        """Unit name -> where it runs, when units run beyond this machine (Ray); else {}."""
        return self.runtime.placement()

    def unit_stats(self, timeout_s: float = 10.0) -> dict[str, ch.UnitStats]:
        """A fresh snapshot from every healthy unit (blocks until they answer or ``timeout_s``)."""
        return self._gather(timeout_s, with_recent=True)

    def reset_prefix_cache(self, timeout_s: float = 10.0) -> dict[str, int]:
        """Every unit forgets the cached pages nobody holds, and routing what it sent where
        (vLLM's ``/reset_prefix_cache``). Returns each answering unit's free pages after."""
        with self._lock:
            for name in self._roles:
                self.routing.forget(name)
        replies = self._gather(timeout_s, message=ch.ResetPrefixCache)
        return {name: s.num_free_pages for name, s in replies.items()}

    def stats(self, wait_s: float = 0.0) -> list[InstanceStats]:
        """One snapshot per unit: with ``wait_s`` > 0 fresh ones (waits that long at most for the
        units' answers, as a /metrics scrape does), else the latest (a fresh one is asked for)."""
        if wait_s > 0:
            self._gather(wait_s, with_recent=False)
        else:
            for name in self._roles:
                if self.runtime.is_healthy(name):  # a stopped unit reads nothing: sends would pile up
                    self.runtime.send(name, ch.GetStats(0))
        last = self._stats.last()
        return [instance_stats(name, role, self.runtime.is_healthy(name), last.get(name))
                for name, role in self._roles.items()]

    def _gather(self, timeout_s: float, with_recent: bool = False,
                message: type[ch.ResetPrefixCache] | None = None) -> dict[str, ch.UnitStats]:
        """Send each unit ``message(seq)`` (default: GetStats) and wait for their `UnitStats` answers."""
        seq = next(self._seq)
        ask = message(seq) if message is not None else ch.GetStats(seq, with_recent=with_recent)
        return self._stats.gather([n for n in self._roles if self.runtime.is_healthy(n)], seq, ask, timeout_s)

    def close(self) -> None:
        """Close the runtime; requests still in flight end with an error event. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.runtime.close()
        with self._lock:
            states = self._requests.pop_all()
        for rid, state in states.items():
            state.sink(TokenEvent(rid, [], True, "error", error="the runtime was closed"))
            if self.tracing is not None:
                self.tracing.finish(rid, "error", "the runtime was closed")
        if self.tracing is not None:
            self.tracing.close()

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

