"""LocalRuntime: a spec's units as processes on this machine, served as a `ServingBackend`.

One process per unit (an instance, or one dp group of it); each spawns its own tp workers.
Start-up waits for every unit's `Ready`, hands each the others' addresses and region
descriptors, waits for `Started`, and says so. Requests go to the decode (or, colocated, mixed)
unit with the fewest requests in flight; tokens stream back over each unit's pipe and are read by
one thread. A unit that dies is reported with its log tail; its requests end with an error, the
other units are told (decode units retry its prefills elsewhere) and serving goes on.
`close()` (also at interpreter exit) stops every unit and leaves no process behind.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import multiprocessing as mp
import os
import queue
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from multiprocessing.connection import wait as wait_any
from typing import Any

from disaggsdk.launch import channel as ch
from disaggsdk.launch.tiny import LaunchError, check_runnable, tiny_spec
from disaggsdk.launch.unit import UnitArgs, unit_main
from disaggsdk.launch.units import (
    UnitHandle,
    core_sets,
    log_tail,
    process_tree_cpu_s,
    start_units,
    stop_units,
    unit_names,
)
from disaggsdk.report.instance_stats import InstanceStats
from disaggsdk.serve.backend import TokenEvent
from disaggsdk.transfer.shm_files import remove_fabric_shm
from disaggsdk.spec.types import Spec


class LocalRuntime:
    """A whole deployment as local processes.

    Args:
        spec: the deployment.
        tiny: run a GPU spec's topology with its tiny model on the CPU (see `tiny_spec`).
        colocated: every instance "mixed" (prefill and decode in one engine), no messenger: the
            baseline disaggregation is compared with.
        cpu_affinity: None; "auto" (unit i on core i mod cores); or one list of cores per unit
            in start order (prefill units first).
        log_dir: where unit logs go. When None, a temporary directory that close() removes
            unless a unit failed (then its logs are kept for the report).
        provider: libfabric provider overriding the spec ("shm", "tcp").
        start_timeout_s: how long start-up may take.
        on_event: optional callback for start-up and failure lines (default: print to stderr).
        secret: the control-frame secret (random when None).
    Raises:
        LaunchError: a GPU spec without GPUs, or a unit that failed to start (with its log tail).
    """

    def __init__(self, spec: Spec, tiny: bool = False, colocated: bool = False, cpu_affinity: Any = None,
                 log_dir: str | None = None, provider: str | None = None, start_timeout_s: float = 300.0,
                 on_event: Callable[[str], None] | None = None, secret: bytes | None = None):
        from disaggsdk.plan import make_plan
        from disaggsdk.spec import spec_to_yaml

        self.spec = tiny_spec(spec) if tiny else spec
        check_runnable(self.spec)
        self.plan = make_plan(self.spec)
        self.model_name = self.spec.model
        self.colocated = colocated
        self._say = on_event or (lambda line: print(line, file=sys.stderr, flush=True))
        self._closed = False
        self._lock = threading.Lock()
        self._sinks: dict[str, Callable[[TokenEvent], None]] = {}
        self._stats_seq = itertools.count(1)
        self._stats_replies: dict[int, dict[str, ch.UnitStats]] = {}  # only for seqs unit_stats waits on
        self._stats_cond = threading.Condition(self._lock)
        self._last_stats: dict[str, ch.UnitStats] = {}
        self.failures: list[str] = []  # one report per unit that died
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="disaggsdk-logs-")
        os.makedirs(self.log_dir, exist_ok=True)
        self._work_dir = tempfile.mkdtemp(prefix="disaggsdk-run-")
        provider = provider or self.spec.transport.provider
        provider = "shm" if provider == "auto" else provider
        # per deployment: frames from anything else fail their MAC (tests pass one to forge frames)
        secret = secret or secrets.token_bytes(32)
        names = unit_names(self.plan)
        affinity = core_sets(cpu_affinity, len(names))
        spec_yaml = spec_to_yaml(self.spec)
        ctx = mp.get_context("spawn")
        self.units: dict[str, UnitHandle] = {}
        self._tokenizer = None
        atexit.register(self.close)
        try:
            for i, (name, inst) in enumerate(names):
                role = "mixed" if colocated else inst.role
                args = UnitArgs(name, inst.name, role, spec_yaml, secret, provider,
                                os.path.join(self.log_dir, f"{name}.log"), self._work_dir, affinity[i])
                parent, child = ctx.Pipe(duplex=True)
                proc = ctx.Process(target=unit_main, args=(args, child), name=f"disaggsdk-{name}")
                proc.start()
                child.close()
                self.units[name] = UnitHandle(args, proc, parent)
            start_units(self.units, start_timeout_s)
        except BaseException:
            self._own_log_dir = False  # a failed start keeps its logs: the error names them
            self.close()
            raise
        self._reader = threading.Thread(target=self._read_loop, name="disaggsdk-runtime-reader", daemon=True)
        self._reader.start()
        self.unit_stats()  # so stats() has a first snapshot to give
        roles = ", ".join(f"{n} ({u.args.role})" for n, u in self.units.items())
        self._say(f"ready: {len(self.units)} units over {provider}: {roles}; logs in {self.log_dir}")

    # the reader thread

    def _read_loop(self) -> None:
        while not self._closed:
            live = [u for u in self.units.values() if u.healthy]
            if not live:
                time.sleep(0.05)
                continue
            by_conn = {u.conn: u for u in live}
            by_sentinel = {u.process.sentinel: u for u in live}
            try:
                ready = wait_any(list(by_conn) + list(by_sentinel), timeout=0.2)
            except OSError:
                continue
            for obj in ready:
                if obj in by_conn:
                    u = by_conn[obj]
                    try:
                        self._dispatch(u, ch.recv_from_unit(u.conn))
                    except (EOFError, OSError):
                        self._unit_died(u)
                elif obj in by_sentinel:
                    u = by_sentinel[obj]
                    while u.conn.poll(0):  # what it said before dying still counts
                        try:
                            self._dispatch(u, ch.recv_from_unit(u.conn))
                        except (EOFError, OSError):
                            break
                    self._unit_died(u)

    def _dispatch(self, u: UnitHandle, msg: Any) -> None:
        if isinstance(msg, ch.Tokens):
            from disaggsdk.engine.sampling import TokenLogprobs

            logprobs = [TokenLogprobs(lp.token_id, lp.logprob, tuple(tuple(t) for t in lp.top)) for lp in msg.logprobs]
            event = TokenEvent(msg.request_id, msg.token_ids, msg.finished, msg.finish_reason, logprobs,
                               error=msg.error, instance=u.args.name)
            with self._lock:
                sink = self._sinks.get(msg.request_id)
                if msg.finished:
                    u.in_flight.discard(msg.request_id)
                    self._sinks.pop(msg.request_id, None)
            if sink is not None:
                sink(event)
        elif isinstance(msg, ch.UnitStats):
            with self._stats_cond:
                self._last_stats[msg.name] = msg
                if msg.seq in self._stats_replies:
                    self._stats_replies[msg.seq][msg.name] = msg
                self._stats_cond.notify_all()
        elif isinstance(msg, ch.Fatal):
            u.fatal = msg.message

    def _unit_died(self, u: UnitHandle) -> None:
        if self._closed or not u.healthy:
            return
        u.healthy = False
        u.process.join(5)
        remove_fabric_shm(u.process.pid)
        report = (f"unit {u.args.name} ({u.args.role}) died with exit code {u.process.exitcode}"
                  f"{': ' + u.fatal if u.fatal else ''}; last lines of {u.args.log_path}:\n"
                  f"{log_tail(u.args.log_path)}")
        u.exit_report = report
        self.failures.append(report)
        self._say(report)
        for other in self.units.values():
            if other.healthy:
                try:
                    ch.send(other.conn, ch.PeerDown(u.args.name))
                except OSError:
                    pass
        with self._lock:
            lost = [(rid, self._sinks.pop(rid, None)) for rid in u.in_flight]
            u.in_flight.clear()
        for rid, sink in lost:
            if sink is not None:
                sink(TokenEvent(rid, [], True, "error", error=f"unit {u.args.name} died", instance=u.args.name))
        with self._stats_cond:
            self._stats_cond.notify_all()

    # ServingBackend

    def _tok(self) -> Any:
        if self._tokenizer is None:
            from disaggsdk.engine.tokenizer import load_tokenizer

            self._tokenizer = load_tokenizer(self.spec.model)
            if self._tokenizer is None:
                raise LaunchError(f"{self.spec.model} has no tokenizer; send token ids")
        return self._tokenizer

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (with BOS) under the model's tokenizer."""
        return self._tok().encode(text, add_bos=True)

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids``."""
        return self._tok().decode(list(token_ids))

    def submit(self, request_id: str, prompt_ids: Sequence[int], params: Any,
               sink: Callable[[TokenEvent], None]) -> str:
        """Send a request to the least busy serving unit; ``sink`` gets its events (reader thread).

        Returns:
            The unit's name.
        Raises:
            LaunchError: the runtime is closed, no serving unit is healthy, or the id is in use.
        """
        with self._lock:
            if self._closed:
                raise LaunchError("the runtime is closed; start a new one")
            if request_id in self._sinks:
                raise LaunchError(f"request id {request_id!r} is in flight; use a fresh id")
            serving = [u for u in self.units.values() if u.healthy and u.args.role in ("decode", "mixed")]
            if not serving:
                raise LaunchError("no decode unit is healthy; see runtime.failures for what died")
            u = min(serving, key=lambda s: (len(s.in_flight), s.args.name))
            u.in_flight.add(request_id)
            self._sinks[request_id] = sink
        ch.send(u.conn, ch.Generate(request_id, list(prompt_ids), params))
        return u.args.name

    async def generate(self, request_id: str, prompt_ids: Sequence[int], params: Any) -> AsyncIterator[TokenEvent]:
        """Stream a request's tokens (errors arrive as a final event with finish_reason "error")."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        try:
            self.submit(request_id, prompt_ids, params, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
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
        with self._lock:
            owner = next((u for u in self.units.values() if request_id in u.in_flight), None)
        if owner is not None and owner.healthy:
            ch.send(owner.conn, ch.Abort(request_id))

    def generate_batch(self, prompts: Sequence[Sequence[int]], params: Any, timeout_s: float = 300.0,
                       prefix: str = "batch") -> list[list[TokenEvent]]:
        """Run prompts concurrently to completion; returns every request's events in order.

        Raises:
            LaunchError: a request did not finish within ``timeout_s``.
        """
        params_list = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
        done: queue.Queue = queue.Queue()
        events: dict[str, list[TokenEvent]] = {}
        ids = [f"{prefix}-{next(self._stats_seq)}-{i}" for i in range(len(prompts))]

        def sink_for(rid: str) -> Callable[[TokenEvent], None]:
            def sink(ev: TokenEvent) -> None:
                events.setdefault(rid, []).append(ev)
                if ev.finished:
                    done.put(rid)
            return sink

        for rid, prompt, p in zip(ids, prompts, params_list):
            self.submit(rid, prompt, p, sink_for(rid))
        deadline = time.monotonic() + timeout_s
        finished = set()
        while len(finished) < len(ids):
            try:
                finished.add(done.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise LaunchError(f"{len(ids) - len(finished)} requests did not finish in {timeout_s} s") from None
        return [events[rid] for rid in ids]

    def unit_stats(self, timeout_s: float = 10.0) -> dict[str, ch.UnitStats]:
        """A fresh snapshot from every healthy unit (blocks until they answer)."""
        seq = next(self._stats_seq)
        asked = [u for u in self.units.values() if u.healthy]
        with self._lock:
            self._stats_replies[seq] = {}
        for u in asked:
            ch.send(u.conn, ch.GetStats(seq, with_recent=True))
        deadline = time.monotonic() + timeout_s
        with self._stats_cond:
            while True:
                got = self._stats_replies.get(seq, {})
                want = {u.args.name for u in asked if u.healthy}
                if want <= set(got) or time.monotonic() > deadline:
                    return dict(self._stats_replies.pop(seq, {}))
                self._stats_cond.wait(0.1)

    def stats(self) -> list[InstanceStats]:
        """The latest snapshot of every unit (asks for a fresh one without waiting for it)."""
        for u in self.units.values():
            if u.healthy:
                try:
                    ch.send(u.conn, ch.GetStats(0))
                except OSError:
                    pass
        with self._lock:
            last = dict(self._last_stats)
        out = []
        for name, u in self.units.items():
            s = last.get(name)
            out.append(InstanceStats(
                name=name, role=u.args.role, healthy=u.healthy,
                running=s.running if s else 0, waiting=s.waiting if s else 0,
                kv_pages_used=(s.num_pages - s.num_free_pages) if s else 0, kv_pages_total=s.num_pages if s else 0,
                transfer_bytes=s.transfer_bytes if s else 0, transfer_writes=s.transfer_writes if s else 0,
                transfer_s=s.transfer_s if s else 0.0, exposed_transfer_s=s.exposed_transfer_s if s else 0.0,
                transfer_failures=s.transfer_failures if s else 0, requests_retried=s.requests_retried if s else 0,
                extra={"prefilled_locally": float(s.prefilled_locally if s else 0),
                       "rejected_frames": float(sum(s.rejected_frames.values()) if s else 0)},
            ))
        return out

    def unit_cpu_s(self) -> dict[str, float]:
        """CPU seconds each live unit (with its tp workers) has used so far, by unit name."""
        return {name: process_tree_cpu_s(u.process.pid) for name, u in self.units.items() if u.process.is_alive()}

    def kill_unit(self, name: str) -> None:
        """SIGKILL one unit (fault-injection for tests and demos); its death is handled as a crash."""
        self.units[name].process.kill()

    def close(self) -> None:
        """Stop every unit (politely, then by force). Idempotent."""
        if self._closed:
            return
        self._closed = True
        stop_units(getattr(self, "units", {}))
        with self._lock:
            sinks, self._sinks = self._sinks, {}
        for rid, sink in sinks.items():
            sink(TokenEvent(rid, [], True, "error", error="the runtime was closed"))
        shutil.rmtree(self._work_dir, ignore_errors=True)
        if self._own_log_dir and not self.failures and not any(u.fatal for u in getattr(self, "units", {}).values()):
            shutil.rmtree(self.log_dir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> LocalRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
