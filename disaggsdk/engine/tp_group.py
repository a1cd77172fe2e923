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
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.forward_batch import ForwardBatch
from disaggsdk.engine.group_address import free_loopback_address
from disaggsdk.engine.model_runner import ModelRunner, RunnerConfig
from disaggsdk.engine.modeling.layers.moe import held_experts_line
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.engine.dp_lockstep import DataParallelLockstep
    from disaggsdk.engine.speculative.mtp_drafter import MTPPass

_STOP, _RUN, _MTP_FILL, _MTP_CHAIN = 0, 1, 2, 3  # commands: the first field of every header
_HEADER_LEN = 6


class TensorParallelError(DisaggError):
    """A tensor-parallel worker could not start or died."""


IDLE_WAIT_LIMIT_S = 30 * 24 * 3600  # how long a worker waits for its next step: "forever", in gloo terms


@dataclass
class RankGroups:
    """The process groups of one rank, made by `join_groups`."""

    tp: TensorParallel  # this rank's tp context (its ``experts`` dispatcher under ep)
    control: dist.ProcessGroup  # the head's step broadcasts to its tp workers (gloo, waits "forever")
    lockstep: DataParallelLockstep | None  # the dp heads' vote (a head of a dp group of dp_size > 1), else None


def join_groups(engine: EngineConfig, num_experts: int, tp_rank: int, address: str, timeout_s: float) -> RankGroups:
    """Join the instance's process group as tp rank ``tp_rank`` of dp rank ``EngineConfig.dp_rank`` and
    make the subgroups (every rank makes every group, in one order: torch.distributed's rule).

    Args:
        engine: the engine's settings (tp, ep, dp_rank, dp_size, device).
        num_experts: routed experts per MoE layer (placed over the ranks when ``engine.ep > 1``).
        tp_rank: this process's rank among its dp group's tp ranks.
        address: "host:port" of the group's store (rank 0 of the world serves it).
        timeout_s: how long collectives and joining may take.
    """
    tp_size, dp_size = engine.tp, engine.dp_size
    backend = "nccl" if engine.device.startswith("cuda") else "gloo"
    if engine.device == "cuda":
        # the launcher shows a unit its dp group's devices in tp order (launch.cuda_devices): tp rank r
        # owns cuda:r; set before NCCL starts, which binds this rank's communicator to the current device
        torch.cuda.set_device(tp_rank)
    rank = engine.dp_rank * tp_size + tp_rank
    dist.init_process_group(
        backend, init_method=f"tcp://{address}", rank=rank, world_size=tp_size * dp_size,
        timeout=timedelta(seconds=timeout_s),
    )
    # step metadata is small and lives on the CPU: a gloo group even when the model uses NCCL. Its
    # timeout is what an idle engine waits for the next step, so it must not be the collectives'
    # (an instance without requests for 2 minutes lost its workers); a dead head still ends the
    # wait at once: its connection closes (and the workers die with it)
    idle = timedelta(seconds=IDLE_WAIT_LIMIT_S)
    heads = None
    if dp_size == 1:
        tp_group: dist.ProcessGroup | None = dist.group.WORLD
        control = _member(dist.new_group(backend="gloo", timeout=idle))
    else:
        for d in range(dp_size):
            ranks = list(range(d * tp_size, (d + 1) * tp_size))
            group = dist.new_group(ranks, timeout=timedelta(seconds=timeout_s))
            group_control = dist.new_group(ranks, backend="gloo", timeout=idle)
            if d == engine.dp_rank:
                tp_group, control = _member(group), _member(group_control)
        heads = dist.new_group([d * tp_size for d in range(dp_size)], backend="gloo", timeout=idle)
    experts = None
    if engine.ep > 1:
        from disaggsdk.engine.expert_parallel import ExpertMap, create_dispatcher

        experts = create_dispatcher("all_to_all", ExpertMap(num_experts, engine.ep), rank, None, engine.device)
    lockstep = None
    if heads is not None and tp_rank == 0:
        from disaggsdk.engine.dp_lockstep import DataParallelLockstep

        lockstep = DataParallelLockstep(_member(heads), engine.dp_rank, dp_size)
    return RankGroups(TensorParallel(rank=tp_rank, size=tp_size, group=tp_group, experts=experts), control, lockstep)


def _send_batch(batch: ForwardBatch | None, control: dist.ProcessGroup) -> None:
    if batch is None:
        dist.broadcast(torch.tensor([_STOP] + [0] * (_HEADER_LEN - 1)), group_src=0, group=control)
        return
    fields = [batch.input_ids, batch.positions, batch.qo_indptr, batch.kv_page_indptr,
              batch.kv_page_indices, batch.kv_last_page_len, batch.kv_slot_ids, batch.logits_indices]
    header = [_RUN, batch.num_tokens, batch.batch_size, int(batch.kv_page_indices.numel()),
              int(batch.logits_indices.numel()), batch.page_size]
    dist.broadcast(torch.tensor(header, dtype=torch.int64), group_src=0, group=control)
    dist.broadcast(torch.cat([f.cpu().to(torch.int64) for f in fields]), group_src=0, group=control)


def _send_ints(command: int, *lists: Sequence[int], control: dist.ProcessGroup) -> None:
    """A header (the command and each list's length) and then the lists, as one int64 tensor."""
    header = [command] + [len(x) for x in lists] + [0] * (_HEADER_LEN - 1 - len(lists))
    dist.broadcast(torch.tensor(header, dtype=torch.int64), group_src=0, group=control)
    if sum(header[1:]):
        dist.broadcast(torch.tensor([v for x in lists for v in x], dtype=torch.int64), group_src=0, group=control)


def _recv_header(control: dist.ProcessGroup) -> list[int]:
    header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
    dist.broadcast(header, group_src=0, group=control)
    return header.tolist()


def _recv_ints(header: list[int], control: dist.ProcessGroup) -> list[list[int]]:
    """The lists `_send_ints` sent (their lengths are in ``header`` after the command)."""
    values: list[int] = []
    if sum(header[1:]):
        payload = torch.empty(sum(header[1:]), dtype=torch.int64)
        dist.broadcast(payload, group_src=0, group=control)
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
    dist.broadcast(payload, group_src=0, group=control)
    parts = [x.to(device) for x in payload.split(sizes)]
    i32 = torch.int32
    return ForwardBatch(
        input_ids=parts[0], positions=parts[1], qo_indptr=parts[2].to(i32), kv_page_indptr=parts[3].to(i32),
        kv_page_indices=parts[4].to(i32), kv_last_page_len=parts[5].to(i32), kv_slot_ids=parts[6],
        logits_indices=parts[7], page_size=page_size,
    )


def _worker_main(rank: int, address: str, config: RunnerConfig, num_experts: int, ready: Connection,
                 timeout_s: float) -> None:
    # ranks share the machine's cores: one thread each avoids oversubscribing them
    torch.set_num_threads(1)
    try:
        groups = join_groups(config.engine, num_experts, rank, address, timeout_s)
        tp, control = groups.tp, groups.control
        kv_region = None
        if config.engine.kv_share_path:  # the head's transfer engine registers this rank's pool too
            from disaggsdk.engine.shared_kv import pool_bytes, pool_tensor, share_pool
            from disaggsdk.kv.pools.pool_handover import die_with_parent

            die_with_parent()
            kv_region = share_pool(config, tp)
        runner = ModelRunner(config, tp, pool_tensor(kv_region, pool_bytes(config, tp)) if kv_region else None)
    except Exception as exc:  # noqa: BLE001 - any start-up failure is reported to rank 0, which raises it typed
        ready.send(f"rank {rank}: {type(exc).__name__}: {exc}")
        return
    ready.send(("ok", held_experts_line(runner.model)))
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

    With expert parallelism it is also the head's place in the instance's group (see the module
    doc), so it exists at tp 1 too then, with no workers.

    Args:
        config: what every rank builds (``config.engine`` says tp, ep and the dp group).
        num_experts: the model's routed experts per MoE layer (0: a dense model).
        timeout_s: how long collectives and worker start-up may take before failing.
    Raises:
        TensorParallelError: a worker failed to start (its error is in the message).
    """

    def __init__(self, config: RunnerConfig, num_experts: int, timeout_s: float = 120.0):
        engine = config.engine
        self.size = size = engine.tp
        ctx = mp.get_context("spawn")
        # a dp group's ranks meet where the launcher said; a lone instance's where its head chose
        address = engine.group_address or free_loopback_address()
        self.procs: list[BaseProcess] = []
        # each worker's `held_experts_line` (what its parameters hold under ep), as it reported at start
        self.held_experts: list[str | None] = []
        pipes = []
        for rank in range(1, size):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker_main, args=(rank, address, config, num_experts, child, timeout_s),
                               daemon=True)
            proc.start()
            self.procs.append(proc)
            pipes.append(parent)
        self._initialized = False
        try:
            groups = join_groups(engine, num_experts, 0, address, timeout_s)
            self.tp, self._control, self.lockstep = groups.tp, groups.control, groups.lockstep
            self._initialized = True
            deadline = time.monotonic() + timeout_s
            for rank, (worker, pipe) in enumerate(zip(self.procs, pipes), start=1):
                while not pipe.poll(0.1):
                    if not worker.is_alive() or time.monotonic() > deadline:
                        raise TensorParallelError(f"tp rank {rank} died or hung while starting; see its stderr")
                status = pipe.recv()
                if isinstance(status, str):
                    raise TensorParallelError(f"tp worker failed to start: {status}")
                self.held_experts.append(status[1])
        except BaseException:
            self.close()
            raise

    def broadcast(self, batch: ForwardBatch) -> None:
        """Send this step's batch to every worker (they run it as rank 0 does).

        Raises:
            TensorParallelError: a worker has died (a collective with it would hang until timeout).
        """
        if self.size == 1:
            return  # an expert-parallel head at tp 1: nobody to tell
        dead = [rank for rank, p in enumerate(self.procs, start=1) if not p.is_alive()]
        if dead:
            raise TensorParallelError(f"tp ranks {dead} have exited; close this engine and start a new one")
        _send_batch(batch, self._control)

    def mtp_fill(self, next_ids: Sequence[int], rows: Sequence[int]) -> None:
        """Have every worker run `MTPPass.fill` over the step it just ran (speculative.mtp_drafter)."""
        if self.size == 1:
            return
        _send_ints(_MTP_FILL, next_ids, rows, control=self._control)

    def mtp_chain(self, keep: Sequence[int], chain: ForwardBatch) -> None:
        """Have every worker run `MTPPass.chain` with ``keep`` over ``chain``."""
        if self.size == 1:
            return
        _send_ints(_MTP_CHAIN, keep, control=self._control)
        _send_batch(chain, self._control)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the workers (politely, then by force) and leave the process group. Idempotent."""
        if self._initialized:
            try:
                if self.procs and all(p.is_alive() for p in self.procs):
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


def _member(group: object) -> dist.ProcessGroup:
    """A group this rank belongs to, as a ProcessGroup: `new_group` returns a marker to the ranks outside
    a group (typed so from torch 2.14), and every group kept here is one of this rank's."""
    if not isinstance(group, dist.ProcessGroup):
        raise RuntimeError(f"this rank is not in the group it joined: {group!r}")
    return group
