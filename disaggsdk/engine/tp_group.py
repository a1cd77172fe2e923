"""Tensor parallelism across processes: rank 0 (the engine) spawns ranks 1..tp-1 and leads each step.

Every rank loads its own shard and keeps its own KV cache with the same page ids. Rank 0
schedules, then broadcasts the step's `ForwardBatch` over a gloo group; all ranks run the same
forward (the model's all-reduces keep them in lockstep) and only rank 0 samples. With MTP
speculation, rank 0 also mirrors each call of its `MTPPass` (fill the layer's KV over the step,
then one call per chained draft) and the workers make the same call on their shard. Workers are
daemon processes started with "spawn"; `close` stops them and, failing that, kills them.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Sequence
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from disaggsdk.engine.forward_batch import ForwardBatch
from disaggsdk.engine.model_runner import ModelRunner, RunnerConfig
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.engine.speculative.mtp_drafter import MTPPass

_STOP, _RUN, _MTP_FILL, _MTP_CHAIN = 0, 1, 2, 3  # commands: the first field of every header
_HEADER_LEN = 6


class TensorParallelError(DisaggError):
    """A tensor-parallel worker could not start or died."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


IDLE_WAIT_LIMIT_S = 30 * 24 * 3600  # how long a worker waits for its next step: "forever", in gloo terms


def _init(rank: int, size: int, port: int, device: str, timeout_s: float) -> tuple[TensorParallel, dist.ProcessGroup]:
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
        timeout=timedelta(seconds=timeout_s),
    )
    # step metadata is small and lives on the CPU: a gloo group even when the model uses NCCL. Its
    # timeout is what an idle engine waits for the next step, so it must not be the collectives'
    # (an instance without requests for 2 minutes lost its workers); a dead head still ends the
    # wait at once: its connection closes (and the workers die with it)
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=IDLE_WAIT_LIMIT_S))
    return TensorParallel(rank=rank, size=size, group=dist.group.WORLD), control


def _send_batch(batch: ForwardBatch | None, control: dist.ProcessGroup) -> None:
    if batch is None:
        dist.broadcast(torch.tensor([_STOP] + [0] * (_HEADER_LEN - 1)), src=0, group=control)
        return
    fields = [batch.input_ids, batch.positions, batch.qo_indptr, batch.kv_page_indptr,
              batch.kv_page_indices, batch.kv_last_page_len, batch.kv_slot_ids, batch.logits_indices]
    header = [_RUN, batch.num_tokens, batch.batch_size, int(batch.kv_page_indices.numel()),
              int(batch.logits_indices.numel()), batch.page_size]
    dist.broadcast(torch.tensor(header, dtype=torch.int64), src=0, group=control)
    dist.broadcast(torch.cat([f.cpu().to(torch.int64) for f in fields]), src=0, group=control)


def _send_ints(command: int, *lists: Sequence[int], control: dist.ProcessGroup) -> None:
    """A header (the command and each list's length) and then the lists, as one int64 tensor."""
    header = [command] + [len(x) for x in lists] + [0] * (_HEADER_LEN - 1 - len(lists))
    dist.broadcast(torch.tensor(header, dtype=torch.int64), src=0, group=control)
    if sum(header[1:]):
        dist.broadcast(torch.tensor([v for x in lists for v in x], dtype=torch.int64), src=0, group=control)


def _recv_header(control: dist.ProcessGroup) -> list[int]:
    header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
    dist.broadcast(header, src=0, group=control)
    return header.tolist()


def _recv_ints(header: list[int], control: dist.ProcessGroup) -> list[list[int]]:
    """The lists `_send_ints` sent (their lengths are in ``header`` after the command)."""
    values: list[int] = []
    if sum(header[1:]):
        payload = torch.empty(sum(header[1:]), dtype=torch.int64)
        dist.broadcast(payload, src=0, group=control)
        values = payload.tolist()
    out, start = [], 0
    for n in header[1:]:
        out.append(values[start:start + n])
        start += n
    return out


def _recv_batch(control: dist.ProcessGroup, device: torch.device, header: list[int] | None = None) -> ForwardBatch | None:
    cmd, n, b, p, lg, page_size = header or _recv_header(control)
    if cmd == _STOP:
        return None
    sizes = [n, n, b + 1, b + 1, p, b, n, lg]
    payload = torch.empty(sum(sizes), dtype=torch.int64)
    dist.broadcast(payload, src=0, group=control)
    parts = [x.to(device) for x in payload.split(sizes)]
    i32 = torch.int32
    return ForwardBatch(
        input_ids=parts[0], positions=parts[1], qo_indptr=parts[2].to(i32), kv_page_indptr=parts[3].to(i32),
        kv_page_indices=parts[4].to(i32), kv_last_page_len=parts[5].to(i32), kv_slot_ids=parts[6],
        logits_indices=parts[7], page_size=page_size,
    )


def _worker_main(rank: int, size: int, port: int, config: RunnerConfig, ready: Connection, timeout_s: float) -> None:
    # ranks share the machine's cores: one thread each avoids oversubscribing them
    torch.set_num_threads(1)
    try:
        tp, control = _init(rank, size, port, config.engine.device, timeout_s)
        kv_region = None
        if config.engine.kv_share_path:  # the head's transfer engine registers this rank's pool too
            from disaggsdk.engine.shared_kv import share_pool
            from disaggsdk.memory.pool_handover import die_with_parent

            die_with_parent()
            kv_region = share_pool(config, tp)
        runner = ModelRunner(config, tp, kv_region.buffer if kv_region else None)
    except Exception as exc:  # noqa: BLE001 - any start-up failure is reported to rank 0, which raises it typed
        ready.send(f"rank {rank}: {type(exc).__name__}: {exc}")
        return
    ready.send("ok")
    _serve(runner, control)
    dist.destroy_process_group()


def _serve(runner: ModelRunner, control: dist.ProcessGroup) -> None:
    """A worker's loop: make each call rank 0 announces, until it says stop."""
    mtp_pass: MTPPass | None = None
    batch: ForwardBatch | None = None  # the last step's, still planned: the MTP layer's fill runs over it
    hidden_all: torch.Tensor | None = None  # [num_tokens, hidden_size] of that step
    if runner.config.extra_kv_layers:
        from disaggsdk.engine.speculative.mtp_drafter import MTPPass

        mtp_pass = MTPPass(runner.model, runner.attn, runner.device)
    while (header := _recv_header(control))[0] != _STOP:
        if header[0] == _RUN:
            batch = _recv_batch(control, runner.device, header)
            assert batch is not None, "a run header brings a batch"
            hidden_all = runner.run_keeping_hidden(batch)[0]
        elif header[0] == _MTP_FILL:
            next_ids, rows = _recv_ints(header, control)[:2]
            assert mtp_pass is not None and batch is not None and hidden_all is not None, "a fill follows a step"
            with torch.inference_mode():
                mtp_pass.fill(batch, hidden_all, next_ids, rows)
        elif header[0] == _MTP_CHAIN:
            keep = _recv_ints(header, control)[0]
            chain = _recv_batch(control, runner.device)
            assert mtp_pass is not None and chain is not None, "a chain follows a fill"
            with torch.inference_mode():
                mtp_pass.chain(keep, chain)


class TPGroup:
    """Rank 0's handle on the tensor-parallel group: the workers, the process group, the broadcast.

    Args:
        config: what every rank builds.
        size: tp, at least 2.
        timeout_s: how long collectives and worker start-up may take before failing.
    Raises:
        TensorParallelError: a worker failed to start (its error is in the message).
    """

    def __init__(self, config: RunnerConfig, size: int, timeout_s: float = 120.0):
        assert size >= 2
        self.size = size
        ctx = mp.get_context("spawn")
        port = _free_port()
        self.procs: list[BaseProcess] = []
        pipes = []
        for rank in range(1, size):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker_main, args=(rank, size, port, config, child, timeout_s), daemon=True)
            proc.start()
            self.procs.append(proc)
            pipes.append(parent)
        self._initialized = False
        try:
            self.tp, self._control = _init(0, size, port, config.engine.device, timeout_s)
            self._initialized = True
            deadline = time.monotonic() + timeout_s
            for rank, (worker, pipe) in enumerate(zip(self.procs, pipes), start=1):
                while not pipe.poll(0.1):
                    if not worker.is_alive() or time.monotonic() > deadline:
                        raise TensorParallelError(f"tp rank {rank} died or hung while starting; see its stderr")
                status = pipe.recv()
                if status != "ok":
                    raise TensorParallelError(f"tp worker failed to start: {status}")
        except BaseException:
            self.close()
            raise

    def broadcast(self, batch: ForwardBatch) -> None:
        """Send this step's batch to every worker (they run it as rank 0 does).

        Raises:
            TensorParallelError: a worker has died (a collective with it would hang until timeout).
        """
        dead = [rank for rank, p in enumerate(self.procs, start=1) if not p.is_alive()]
        if dead:
            raise TensorParallelError(f"tp ranks {dead} have exited; close this engine and start a new one")
        _send_batch(batch, self._control)

    def mtp_fill(self, next_ids: Sequence[int], rows: Sequence[int]) -> None:
        """Have every worker run `MTPPass.fill` over the step it just ran (speculative.mtp_drafter)."""
        _send_ints(_MTP_FILL, next_ids, rows, control=self._control)

    def mtp_chain(self, keep: Sequence[int], chain: ForwardBatch) -> None:
        """Have every worker run `MTPPass.chain` with ``keep`` over ``chain``."""
        _send_ints(_MTP_CHAIN, keep, control=self._control)
        _send_batch(chain, self._control)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers (politely, then by force) and leave the process group. Idempotent."""
        if self._initialized:
            try:
                if all(p.is_alive() for p in self.procs):
                    _send_batch(None, self._control)
            finally:
                dist.destroy_process_group()
                self._initialized = False
        for proc in self.procs:
            proc.join(timeout_s)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.procs = []
