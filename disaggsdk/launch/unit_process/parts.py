"""Assembling one unit: its engine and, unless colocated, its KV pools, transfer engine and messenger.

One function for a colocated unit (`assemble_mixed`), one for prefill and decode (`assemble_disaggregated`);
the unit's loop (`launch.unit_process.unit`) only sees the resulting `UnitParts`, whose three role-specific methods say what a
request, an abort and a finished step mean for that role. Nothing here blocks on other units.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from disaggsdk.engine.config import EngineConfig
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.messenger.ports import Messenger
from disaggsdk.plan.kv_tiers import units_on_node

if TYPE_CHECKING:
    from disaggsdk.engine.compile_progress import CompileProgress
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.engine.sequence import RequestOutput
    from disaggsdk.kv.pools.base import RankPool
    from disaggsdk.kv.pools.host_mirror import HostMirror
    from disaggsdk.launch.kv_registration import UnitPools
    from disaggsdk.launch.messages import UnitArgs
    from disaggsdk.messenger.decode_side import DecodeMessenger
    from disaggsdk.messenger.freshness import FrameCodec
    from disaggsdk.messenger.kv_migration import MovedIn, MoveEnded
    from disaggsdk.messenger.prefill_side import PrefillMessenger
    from disaggsdk.plan import Plan
    from disaggsdk.spec.types import Spec
    from disaggsdk.transfer import MemoryRegion, TransferEngine


@dataclass
class UnitParts:
    """What one unit runs. The colocated ("mixed") kind: an engine and nothing else."""

    engine: LLMEngine
    info: UnitInfo
    messenger: Messenger | None = None
    transfer: TransferEngine | None = None
    regions: list[RankPool] = field(default_factory=list)  # each tp rank's KV pool (and host mirror)
    registrations: list[MemoryRegion] = field(default_factory=list)  # of each pool and the context
    context: bytearray | None = None  # the context slots (decode: written into; prefill: staged in)
    kv: KVUnit | None = None  # what a prefill or decode unit's messenger is built on (None: colocated)

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams, traced: bool = False) -> None:
        """Start a request on this unit (``traced``: the router traces it, `launch.unit_process.spans`)."""
        self.engine.add_request(request_id, prompt_ids, params)

    def abort(self, request_id: str) -> None:
        """Stop a request (its pages are freed by whoever holds them, once nothing can land)."""
        self.engine.abort(request_id)

    def after_step(self, outputs: list[RequestOutput], forward_end_s: float) -> list[RequestOutput]:
        """Hand a step's outputs on; returns those whose tokens go to the runtime."""
        return outputs

    def prefill_unit_of(self, request_id: str) -> str:
        """The prefill unit that computed the prompt of ``request_id``: "" here, where the engine did."""
        return ""

    def move(self, request_id: str, target: str) -> None:
        """Start moving a decoding request to decode unit ``target`` (a decode unit's only).

        Raises:
            MigrationError: the move cannot start; the request goes on here untouched.
        """
        from disaggsdk.engine.request_migration import MigrationError

        raise MigrationError(f"only decode units move requests; this one is {self.info.role}")

    def cancel_move(self, request_id: str, reason: str) -> None:
        """Call off moving ``request_id`` away (`launch.messages.CancelMove`); its end comes out of
        `take_moves`. Nothing moves away from a unit that is not a decode unit."""

    def take_moves(self) -> tuple[list[MovedIn], list[MoveEnded]]:
        """The requests that moved here, and the moves started here that ended, since the last call."""
        return [], []

    def close(self) -> None:
        """Stop the messenger, the tp workers and the transfer engine. Idempotent."""
        if self.messenger is not None:
            self.messenger.close()
            self.messenger = None
        self.engine.close()
        _close_transfer(self.transfer, self.registrations)
        self.registrations = []
        self.transfer = None


class PrefillParts(UnitParts):
    """A prefill unit: requests arrive as control frames, never from the runtime; it emits nothing."""

    messenger: PrefillMessenger | None

    def after_step(self, outputs: list[RequestOutput], forward_end_s: float) -> list[RequestOutput]:
        if self.messenger is not None:  # None once closed
            self.messenger.after_step(outputs, forward_end_s)
        return []


class DecodeParts(UnitParts):
    """A decode unit: a request first waits for its KV in the messenger, then joins the engine."""

    messenger: DecodeMessenger | None

    def submit(self, request_id: str, prompt_ids: list[int], params: SamplingParams, traced: bool = False) -> None:
        if self.messenger is not None:  # None once closed
            self.messenger.submit(request_id, prompt_ids, params, traced)

    def abort(self, request_id: str) -> None:
        if self.messenger is not None:
            self.messenger.prefilled_by.pop(request_id, None)
        if self.messenger is None or not self.messenger.abort(request_id):
            self.engine.abort(request_id)

    def prefill_unit_of(self, request_id: str) -> str:
        """The prefill unit that computed the prompt of ``request_id``, once (then ""); "" when none did."""
        return self.messenger.prefilled_by.pop(request_id, "") if self.messenger is not None else ""

    def move(self, request_id: str, target: str) -> None:
        from disaggsdk.engine.request_migration import MigrationError

        if self.messenger is None:
            raise MigrationError("the unit is closing")
        self.messenger.migrate(request_id, target)

    def cancel_move(self, request_id: str, reason: str) -> None:
        if self.messenger is not None:
            self.messenger.migrations.cancel(request_id, reason)

    def take_moves(self) -> tuple[list[MovedIn], list[MoveEnded]]:
        if self.messenger is None:
            return [], []
        m = self.messenger.migrations
        moved_in, ended = m.moved_in, m.ended
        m.moved_in, m.ended = [], []
        return moved_in, ended


@dataclass
class KVUnit:
    """A prefill or decode unit's engine over shared pools, its transfer engine and its registrations."""

    engine: LLMEngine
    transfer: TransferEngine
    regions: list[RankPool]  # each tp rank's KV pool, then their host mirrors if any: kept mapped while registered
    pools: list[MemoryRegion]  # the registration of each pool (or of its mirror)
    context: bytearray  # the context slots
    context_region: MemoryRegion  # their registration
    info: UnitInfo
    staging: HostMirror | None = None  # the host mirrors' copies, when the pools are registered through them
    pool_bytes: int = 0  # one rank's pool
    remote_write: bool = False  # peers write into the pools and context under their whole-region keys

    def parts(self, kind: type[UnitParts], messenger: Messenger) -> UnitParts:
        """The unit's parts with ``messenger`` on top."""
        return kind(self.engine, self.info, messenger, self.transfer, self.regions,
                    [*self.pools, self.context_region], self.context, self)

    def prefill_messenger(self, args: UnitArgs, spec: Spec, plan: Plan, codec: FrameCodec | None = None
                          ) -> PrefillMessenger:
        """The prefill side of the messenger over these parts. Its KV streams layer by layer when the
        engine counts layers (a unit built as decode without `serve.autoscale` does not: it sends
        each step's pages after the forward pass instead)."""
        from disaggsdk.messenger.prefill_job import ContextStaging
        from disaggsdk.messenger.prefill_side import PrefillMessenger

        return PrefillMessenger(
            self.info, engine=self.engine, transfer=self.transfer, plan=plan, pool_regions=self.pools,
            staging=ContextStaging(self.context_region, memoryview(self.context)), secret=args.secret,
            streaming=spec.transfer.streaming and self.engine.config.count_layers,
            verify_pages=spec.transport.verify_pages, kv_mirror=self.staging, codec=codec)

    def decode_messenger(self, args: UnitArgs, spec: Spec, plan: Plan, codec: FrameCodec | None = None
                         ) -> DecodeMessenger:
        """The decode side of the messenger over these parts."""
        from disaggsdk.messenger.decode_side import DecodeMessenger

        return DecodeMessenger(
            self.info, self.engine, self.transfer, plan, memoryview(self.context), args.secret,
            deadline_s=spec.transfer.deadline_s, pools=self.pools, context_region=self.context_region,
            grant_keys=spec.transport.grant_keys_on(args.provider), verify_pages=spec.transport.verify_pages,
            kv_mirror=self.staging, codec=codec)

    def reregister(self, remote_write: bool) -> None:
        """Register the pools and the context again, open to peers' writes or not (a unit changing role:
        a decode unit without grant keys is written into, a prefill unit's regions are write sources
        only); the old registrations close and ``info`` carries the new descriptors."""
        from disaggsdk.launch.kv_registration import register_rank_pool

        if remote_write == self.remote_write:
            return
        tp = len(self.pools)
        pools = [register_rank_pool(self.transfer, pool, self.pool_bytes, remote_write) for pool in self.regions[:tp]]
        context_region = self.transfer.register(self.context, remote_write=remote_write)
        for old in [*self.pools, self.context_region]:
            self.transfer.deregister(old)
        self.pools, self.context_region, self.remote_write = pools, context_region, remote_write
        self.info = msgspec.structs.replace(self.info, pool_regions=[p.descriptor.to_bytes() for p in pools],
                                            context_region=context_region.descriptor.to_bytes())

    def close(self) -> None:
        """What `UnitParts.close` does, for a unit whose messenger could not be built."""
        self.engine.close()
        _close_transfer(self.transfer, [*self.pools, self.context_region])


def _close_transfer(transfer: TransferEngine | None, registrations: Sequence[MemoryRegion]) -> None:
    if transfer is None:
        return
    # release each buffer export while the buffers are certainly alive: left to the
    # garbage collector at exit, a view could be released after its mmap is gone
    for registration in registrations:
        try:
            transfer.deregister(registration)
        except Exception:  # noqa: BLE001 - writes still in flight: the endpoint's close frees it
            pass
    transfer.close()


def unit_info(args: UnitArgs, address: bytes = b"", pools: list[bytes] | None = None, context: bytes = b"",
              slot_bytes: int = 0) -> UnitInfo:
    """How the other units see this one (a fresh incarnation per process start)."""
    return UnitInfo(args.name, args.instance, args.role, uuid.uuid4().hex[:12], address, pools or [],
                    context, slot_bytes, args.num_context_slots)


def assemble(args: UnitArgs, spec: Spec, plan: Plan, on_compile: Callable[[CompileProgress], None] | None = None) -> UnitParts:
    """The parts of the unit ``args`` describes; ``on_compile``: see `LLMEngine`."""
    return {"mixed": assemble_mixed, "prefill": assemble_disaggregated, "decode": assemble_disaggregated}[args.role](
        args, spec, plan, on_compile)


def assemble_mixed(args: UnitArgs, spec: Spec, plan: Plan,
                   on_compile: Callable[[CompileProgress], None] | None = None) -> UnitParts:
    """A colocated unit: one engine that prefills and decodes, no messenger."""
    from disaggsdk.engine.llm_engine import LLMEngine

    instance = plan.instance(args.instance)
    config = EngineConfig.from_spec(spec, tp=instance.tp, role="mixed", instance_role=instance.role,
                                    dp_rank=args.dp_rank, group_address=args.group_address, unit_name=args.name,
                                    units_on_node=units_on_node(plan, args.instance))
    print(f"{args.name}: building {spec.model} tp={instance.tp} mode={config.mode}{_on_cpu(config)}", flush=True)
    engine = LLMEngine(spec.model, config, on_compile=on_compile)
    for line in engine.held_experts():
        print(f"{args.name}: {line}", flush=True)
    return UnitParts(engine, unit_info(args))


def assemble_disaggregated(args: UnitArgs, spec: Spec, plan: Plan,
                           on_compile: Callable[[CompileProgress], None] | None = None) -> UnitParts:
    """A prefill or decode unit: pools, transfer engine, and its role's side of the messenger."""
    kv = _kv_unit(args, spec, plan, on_compile)
    try:
        messenger: Messenger = (kv.prefill_messenger if args.role == "prefill" else kv.decode_messenger)(args, spec, plan)
    except BaseException:
        kv.close()
        raise
    return kv.parts(PrefillParts if args.role == "prefill" else DecodeParts, messenger)


def kv_domain(args: UnitArgs) -> str | None:
    """The libfabric domain of the unit's KV endpoint: for tcp the interface that reaches its peers
    (`transfer.interfaces.tcp_domain`: ``FI_TCP_IFACE``, else the one holding ``args.node_address``,
    else "lo"); None for other providers (their own default).

    Raises:
        TransferError: no interface here holds ``args.node_address``.
    """
    from disaggsdk.transfer.interfaces import tcp_domain

    return tcp_domain(args.node_address) if args.provider.startswith("tcp") else None


def _kv_unit(args: UnitArgs, spec: Spec, plan: Plan, on_compile: Callable[[CompileProgress], None] | None) -> KVUnit:
    """An engine over shareable pools on its device (rank 0's here, the workers' handed over), all
    registered with one transfer engine (or through host mirrors: `launch.kv_registration`), and the
    context slots."""
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.shared_kv import pool_tensor
    from disaggsdk.kv.pools import create_rank_pool
    from disaggsdk.kv.pools.pool_handover import PoolCollector
    from disaggsdk.launch.kv_registration import register_pools
    from disaggsdk.messenger.context import context_bytes

    tp = plan.instance(args.instance).tp
    share_path = os.path.join(args.work_dir, f"{args.name}.kv.sock") if tp > 1 else None
    config = EngineConfig.from_spec(spec, tp=tp, role=args.role, kv_share_path=share_path, dp_rank=args.dp_rank,
                                    group_address=args.group_address, unit_name=args.name,
                                    units_on_node=units_on_node(plan, args.instance))
    print(f"{args.name}: building {spec.model} tp={tp} ep={config.ep} mode={config.mode}"
          + (f" dp rank {config.dp_rank} of a lock-step {config.dp_size}" if config.lockstep else "")
          + _on_cpu(config), flush=True)
    size_bytes = _pool_bytes(plan, config, tp)
    pool0 = create_rank_pool(size_bytes, config.device, f"{args.name}-kv-rank0")
    regions: list[RankPool] = [pool0]
    engine: LLMEngine | None = None
    unit_pools: UnitPools | None = None
    try:
        collector = PoolCollector(share_path, tp - 1) if share_path else None
        try:
            engine = LLMEngine(spec.model, config, kv_buffer=pool_tensor(pool0, size_bytes), on_compile=on_compile)
            for line in engine.held_experts():
                print(f"{args.name}: {line}", flush=True)
            if collector is not None:
                workers = collector.wait(timeout_s=60)
                regions += [workers[r] for r in range(1, tp)]
        finally:
            if collector is not None:
                collector.close()
        # Peers write only into a decode unit's pools and context, and there only under the
        # whole-region key when grant keys are off; a prefill unit's regions are write sources.
        targets = args.role == "decode" and not spec.transport.grant_keys_on(args.provider)
        fmt = engine.kv.cache.fmt
        unit_pools = register_pools(spec, args.provider, regions, size_bytes, fmt.num_layers, fmt.num_pages, targets,
                                    domain=kv_domain(args))
        print(f"{args.name}: KV pools {unit_pools.mode}: {unit_pools.reason}; endpoint {unit_pools.transfer.provider} "
              f"on {unit_pools.transfer.domain}", flush=True)
        transfer = unit_pools.transfer
        pools = unit_pools.registrations
        slot_bytes = context_bytes(plan.arch.hidden_size, plan.arch.vocab_size)
        context = bytearray(slot_bytes * args.num_context_slots)
        context_region = transfer.register(context, remote_write=targets)
        info = unit_info(args, transfer.address, [m.descriptor.to_bytes() for m in pools],
                         context_region.descriptor.to_bytes(), slot_bytes)
    except BaseException:
        if engine is not None:
            engine.close()
        if unit_pools is not None:
            _close_transfer(unit_pools.transfer, unit_pools.registrations)
        raise
    return KVUnit(engine, transfer, [*regions, *unit_pools.mirrors], pools, context, context_region, info,
                  unit_pools.staging, size_bytes, targets)


def _on_cpu(config: EngineConfig) -> str:
    """" on <the CPU>" for a CPU engine's start-up line: every figure from its log says where it was taken."""
    if config.device != "cpu":
        return ""
    from disaggsdk.records.host_cpu import host_cpu

    return f" on {host_cpu().line()}"


def _pool_bytes(plan: Plan, config: EngineConfig, tp: int) -> int:
    """Bytes of rank 0's KV pool, by the engine's own rule (`engine.shared_kv.pool_bytes`, which its
    tp workers size theirs with): the KV layers are the plan's, the model's own and, when it drafts
    with it, the MTP layer's."""
    from disaggsdk.engine.model_runner import RunnerConfig
    from disaggsdk.engine.parallel import TensorParallel
    from disaggsdk.engine.shared_kv import pool_bytes

    runner = RunnerConfig(plan.spec.model, config, extra_kv_layers=plan.kv_layers - plan.arch.num_layers)
    return pool_bytes(runner, TensorParallel(0, tp))
