"""One unit process: an engine (with its tp workers) and, unless colocated, its messenger.

Started by `LocalRuntime` with "spawn". Start-up: build the engine over memfd pools (rank 0's
here, the workers' received over SCM_RIGHTS), register every pool with one transfer engine,
report `Ready` with the descriptors, receive the other units' `Peers`, report `Started`. Then a
single loop owns the engine: parent commands, control frames, messenger polling, one step.
Output goes to the unit's log file, whose tail the launcher shows when the unit dies.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any

from disaggsdk.launch import channel as ch

IDLE_WAIT_S = 0.002  # how long an idle unit blocks on its parent pipe between polls
BUSY_WAIT_S = 0.0005  # the same while only transfers are in flight (no step to run)


@dataclass(frozen=True)
class UnitArgs:
    """What a unit needs to start (plain values: sent once from the launcher to its own child)."""

    name: str
    instance: str
    role: str  # "prefill" | "decode" | "mixed"
    spec_yaml: str
    secret: bytes
    provider: str
    log_path: str
    work_dir: str
    cpu_ids: tuple[int, ...] | None = None
    num_context_slots: int = 64


def unit_main(args: UnitArgs, conn: Any) -> None:
    """Entry point of a unit process."""
    from disaggsdk.memory.pool_handover import die_with_parent

    die_with_parent()
    log_fd = os.open(args.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides when units stop
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if args.cpu_ids:
        os.sched_setaffinity(0, args.cpu_ids)
    unit = None
    try:
        import torch

        torch.set_num_threads(len(args.cpu_ids) if args.cpu_ids else 1)
        unit = Unit(args, conn)
        unit.run()
    except BaseException as exc:  # report, then exit non-zero: the launcher shows the log tail
        traceback.print_exc()
        try:
            ch.send(conn, ch.Fatal(f"{args.name}: {type(exc).__name__}: {exc}"))
        except OSError:
            pass
        if unit is not None:
            unit.close()
        sys.stdout.flush()
        os._exit(1)
    unit.close()
    print(f"{args.name}: stopped", flush=True)


class Unit:
    """The state of one unit process (see the module doc)."""

    def __init__(self, args: UnitArgs, conn: Any):
        from disaggsdk.engine.llm_engine import EngineConfig, LLMEngine
        from disaggsdk.memory.shared_memory import SharedRegion
        from disaggsdk.plan import make_plan
        from disaggsdk.spec import parse_spec_yaml

        self.args, self.conn = args, conn
        self.stopping = False
        self.messenger: Any = None
        self.transfer: Any = None
        self.regions: list[Any] = []
        self.registrations: list[Any] = []
        self.collector = None
        self.engine = None
        spec = parse_spec_yaml(args.spec_yaml)
        self.plan = plan = make_plan(spec)
        tp = plan.instance(args.instance).tp
        mode = {"prefill": "prefill_only", "decode": "mixed", "mixed": "mixed"}[args.role]
        share = tp > 1 and args.role != "mixed"
        config = EngineConfig(
            tp=tp, layout=spec.kv.layout, page_size=spec.kv.page_size, num_pages=spec.engine.num_pages,
            max_num_batched_tokens=spec.engine.max_num_batched_tokens, max_num_seqs=spec.engine.max_num_seqs,
            mode=mode, device=spec.device, dtype="float32", kv_dtype=spec.kv.dtype, seed=spec.seed,
            return_hidden_states=args.role == "prefill",
            kv_share_path=os.path.join(args.work_dir, f"{args.name}.kv.sock") if share else None,
        )
        print(f"{args.name}: building {spec.model} tp={tp} mode={mode}", flush=True)
        if args.role == "mixed":
            self.engine = LLMEngine(spec.model, config)
            ch.send(conn, ch.Ready(self._info(b"", [], b"", 0)))
            self._await_peers()
            return
        from disaggsdk.memory.pool_handover import PoolCollector
        from disaggsdk.messenger.context import context_bytes
        from disaggsdk.transfer import TransferEngine

        region0 = SharedRegion.create(_pool_bytes(spec, plan.arch, config, tp), f"{args.name}-kv-rank0")
        self.regions.append(region0)
        if share:
            self.collector = PoolCollector(config.kv_share_path, tp - 1)
        self.engine = LLMEngine(spec.model, config, kv_buffer=region0.buffer)
        if self.collector is not None:
            workers = self.collector.wait(timeout_s=60)
            self.regions += [workers[r] for r in range(1, tp)]
            self.collector.close()
            self.collector = None
        self.transfer = TransferEngine(args.provider, direct=spec.transport.same_host_copy)
        # pools are memfds: prefill units on this machine map them and copy with memcpy
        self.registrations = [self.transfer.register(r.buffer, shared_fd=r.fd) for r in self.regions]
        slot_bytes = context_bytes(plan.arch.hidden_size, plan.arch.vocab_size)
        self.context = bytearray(slot_bytes * args.num_context_slots)
        self.context_mr = self.transfer.register(self.context)
        self.registrations.append(self.context_mr)
        info = self._info(self.transfer.address, [m.descriptor.to_bytes() for m in self.registrations[:-1]],
                          self.context_mr.descriptor.to_bytes(), slot_bytes)
        self.me = info
        secret = args.secret
        if args.role == "prefill":
            from disaggsdk.messenger.prefill_side import PrefillMessenger

            self.messenger = PrefillMessenger(info, self.engine, self.transfer, plan, self.registrations[:-1],
                                              self.context_mr, memoryview(self.context), secret,
                                              streaming=spec.transfer.streaming)
        else:
            from disaggsdk.messenger.decode_side import DecodeMessenger

            self.messenger = DecodeMessenger(info, self.engine, self.transfer, plan, memoryview(self.context), secret,
                                             deadline_s=spec.transfer.deadline_s)
        ch.send(conn, ch.Ready(info))
        self._await_peers()

    def _info(self, address: bytes, pools: list[bytes], context: bytes, slot_bytes: int) -> Any:
        from disaggsdk.messenger.peers import UnitInfo

        return UnitInfo(self.args.name, self.args.instance, self.args.role, uuid.uuid4().hex[:12], address, pools,
                        context, slot_bytes, self.args.num_context_slots)

    def _await_peers(self) -> None:
        msg = ch.recv_to_unit(self.conn)
        if isinstance(msg, ch.Shutdown):
            self.stopping = True
            return
        assert isinstance(msg, ch.Peers), msg
        for info in msg.units:
            if self.args.role == "decode" and info.role == "prefill":
                self.messenger.add_prefill(info)
            elif self.args.role == "prefill" and info.role == "decode":
                self.messenger.add_decode(info)
        ch.send(self.conn, ch.Started(self.args.name))
        print(f"{self.args.name}: started", flush=True)

    # the loop

    def run(self) -> None:
        engine = self.engine
        while not self.stopping:
            if engine.has_unfinished():
                wait_s = 0.0
            elif self.messenger is not None and self._messenger_busy():
                wait_s = BUSY_WAIT_S  # transfers in flight: poll often, but leave the core to others
            else:
                wait_s = IDLE_WAIT_S
            self._drain_parent(wait_s)
            self._drain_frames()
            if self.messenger is not None:
                self.messenger.poll()
                self._report_failures()
            if engine.has_unfinished():
                outputs = engine.step()
                forward_end_s = time.monotonic()
                if self.args.role == "prefill":
                    self.messenger.after_step(outputs, forward_end_s)
                else:
                    self._emit(outputs)

    def _messenger_busy(self) -> bool:
        m = self.messenger
        return bool(getattr(m, "num_jobs", 0) or getattr(m, "num_waiting", 0))

    def _drain_parent(self, wait_s: float) -> None:
        while self.conn.poll(wait_s):
            wait_s = 0.0
            self._handle(ch.recv_to_unit(self.conn))

    def _drain_frames(self) -> None:
        if self.transfer is None:
            return
        from disaggsdk.transfer import TransferError

        while True:
            try:
                frame = self.transfer.recv(timeout_s=0)
            except TransferError:
                return
            self.messenger.on_frame(frame)

    def _handle(self, msg: Any) -> None:
        from disaggsdk.errors import DisaggError

        if isinstance(msg, ch.Generate):
            try:
                params = msg.params
                self._check_prompt(msg.request_id, msg.prompt_ids, params)
                if self.args.role == "decode":
                    self.messenger.submit(msg.request_id, msg.prompt_ids, params)
                else:
                    self.engine.add_request(msg.request_id, msg.prompt_ids, params)
            except DisaggError as exc:
                ch.send(self.conn, ch.Tokens(msg.request_id, [], True, "error", str(exc)))
        elif isinstance(msg, ch.Abort):
            if not (self.args.role == "decode" and self.messenger.abort(msg.request_id)):
                self.engine.abort(msg.request_id)
            ch.send(self.conn, ch.Tokens(msg.request_id, [], True, "abort"))
        elif isinstance(msg, ch.PeerDown):
            if self.messenger is not None:
                self.messenger.peer_down(msg.name)
        elif isinstance(msg, ch.GetStats):
            ch.send(self.conn, self._stats(msg.seq, msg.with_recent))
        elif isinstance(msg, ch.Shutdown):
            self.stopping = True

    def _check_prompt(self, request_id: str, prompt_ids: list[int], params: Any) -> None:
        from disaggsdk.engine.llm_engine import EngineError

        vocab = self.engine.arch.vocab_size
        cfg = self.engine.config
        if not prompt_ids or any(not 0 <= t < vocab for t in prompt_ids):
            raise EngineError(f"{request_id}: the prompt is empty or has token ids outside [0, {vocab})")
        if len(prompt_ids) + params.max_tokens > cfg.num_pages * cfg.page_size:
            raise EngineError(f"{request_id}: prompt + max_tokens exceed the KV pool of "
                              f"{cfg.num_pages * cfg.page_size} tokens; raise engine.num_pages")

    def _emit(self, outputs: list) -> None:
        for out in outputs:
            if out.new_token_ids or out.finished:
                logprobs = [ch.Logprob(lp.token_id, lp.logprob, [tuple(t) for t in lp.top]) for lp in out.new_logprobs]
                ch.send(self.conn, ch.Tokens(out.request_id, list(out.new_token_ids), out.finished,
                                             out.finish_reason, logprobs=logprobs))

    def _report_failures(self) -> None:
        failed = getattr(self.messenger, "failed", None)
        while failed:
            rid, message = failed.pop()
            ch.send(self.conn, ch.Tokens(rid, [], True, "error", message))

    def _stats(self, seq: int, with_recent: bool) -> Any:
        e, m = self.engine, self.messenger
        totals = m.totals if m is not None else None
        waiting = len(e.scheduler.waiting) + (m.num_waiting if hasattr(m, "num_waiting") else 0)
        return ch.UnitStats(
            seq=seq, name=self.args.name, role=self.args.role, running=len(e.scheduler.running), waiting=waiting,
            num_free_pages=e.num_free_pages, num_pages=e.config.num_pages,
            transfer_bytes=totals.bytes if totals else 0, transfer_writes=totals.writes if totals else 0,
            transfer_s=totals.transfer_s if totals else 0.0, exposed_transfer_s=totals.exposed_s if totals else 0.0,
            transfer_failures=totals.failures if totals else 0, requests_retried=totals.retries if totals else 0,
            prefilled_locally=totals.prefilled_locally if totals else 0,
            rejected_frames=dict(m.frames.by_reason) if m is not None else {},
            rejected_requests=dict(getattr(m, "rejected", {})),
            recent=list(totals.recent) if totals and with_recent else [],
        )

    def close(self) -> None:
        """Stop the messenger, the tp workers and the transfer engine; unmap the pools."""
        if self.messenger is not None and hasattr(self.messenger, "close"):
            self.messenger.close()
        if self.messenger is not None and hasattr(self.messenger, "drain_quarantine"):
            self.messenger.drain_quarantine()
        if self.engine is not None:
            self.engine.close()
        if self.collector is not None:
            self.collector.close()
        if self.transfer is not None:
            self.transfer.close()  # its registrations go with the endpoint
            self.transfer = None


def _pool_bytes(spec: Any, arch: Any, config: Any, tp: int) -> int:
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.models import kv_geometry
    from disaggsdk.engine.parallel import TensorParallel

    geometry = kv_geometry(arch, TensorParallel(0, tp))
    return KVCache.page_format(geometry, config.num_pages, config.page_size, config.layout,
                               config.kv_dtype).pool_bytes
