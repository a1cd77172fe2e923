"""Assembling one unit: its engine and, unless colocated, its KV pools, transfer engine and messenger.

One function per role (`assemble_mixed`, `assemble_prefill`, `assemble_decode`); the unit's loop
(`launch.unit`) only sees the resulting `UnitParts`, whose three role-specific methods say what a
request, an abort and a finished step mean for that role. Nothing here blocks on other units.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from disaggsdk.engine.config import EngineConfig
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.messenger.ports import Messenger


@dataclass
class UnitParts:
    """What one unit runs. The colocated ("mixed") kind: an engine and nothing else."""

    engine: Any  # LLMEngine
    info: UnitInfo
    messenger: Messenger | None = None
    transfer: Any = None  # TransferEngine
    regions: list[Any] = field(default_factory=list)  # SharedRegion of each tp rank's KV pool
    registrations: list[Any] = field(default_factory=list)  # MemoryRegion of each pool and the context
    context: bytearray | None = None  # the context slots (decode: written into; prefill: staged in)

    def submit(self, request_id: str, prompt_ids: list[int], params: Any) -> None:
        """Start a request on this unit."""
        self.engine.add_request(request_id, prompt_ids, params)

    def abort(self, request_id: str) -> None:
        """Stop a request (its pages are freed by whoever holds them, once nothing can land)."""
        self.engine.abort(request_id)

    def after_step(self, outputs: list, forward_end_s: float) -> list:
        """Hand a step's outputs on; returns those whose tokens go to the runtime."""
        return outputs

    def close(self) -> None:
        """Stop the messenger, the tp workers and the transfer engine. Idempotent."""
        if self.messenger is not None:
            self.messenger.close()
            self.messenger = None
        if self.engine is not None:
            self.engine.close()
        if self.transfer is not None:
            # release each buffer export while the buffers are certainly alive: left to the
            # garbage collector at exit, a view could be released after its mmap is gone
            for registration in self.registrations:
                try:
                    self.transfer.deregister(registration)
                except Exception:  # noqa: BLE001 - writes still in flight: the endpoint's close frees it
                    pass
            self.registrations = []
            self.transfer.close()
            self.transfer = None


class PrefillParts(UnitParts):
    """A prefill unit: requests arrive as control frames, never from the runtime; it emits nothing."""

    def after_step(self, outputs: list, forward_end_s: float) -> list:
        self.messenger.after_step(outputs, forward_end_s)
        return []


class DecodeParts(UnitParts):
    """A decode unit: a request first waits for its KV in the messenger, then joins the engine."""

    def submit(self, request_id: str, prompt_ids: list[int], params: Any) -> None:
        self.messenger.submit(request_id, prompt_ids, params)

    def abort(self, request_id: str) -> None:
        if not self.messenger.abort(request_id):
            self.engine.abort(request_id)


def unit_info(args: Any, address: bytes = b"", pools: list[bytes] | None = None, context: bytes = b"",
              slot_bytes: int = 0) -> UnitInfo:
    """How the other units see this one (a fresh incarnation per process start)."""
    return UnitInfo(args.name, args.instance, args.role, uuid.uuid4().hex[:12], address, pools or [],
                    context, slot_bytes, args.num_context_slots)


def assemble(args: Any, spec: Any, plan: Any) -> UnitParts:
    """The parts of the unit ``args`` describes (`launch.messages.UnitArgs`)."""
    return {"mixed": assemble_mixed, "prefill": assemble_prefill, "decode": assemble_decode}[args.role](
        args, spec, plan)


def assemble_mixed(args: Any, spec: Any, plan: Any) -> UnitParts:
    """A colocated unit: one engine that prefills and decodes, no messenger."""
    from disaggsdk.engine.llm_engine import LLMEngine

    config = EngineConfig.from_spec(spec, tp=plan.instance(args.instance).tp, role="mixed")
    return UnitParts(LLMEngine(spec.model, config), unit_info(args))


def assemble_prefill(args: Any, spec: Any, plan: Any) -> UnitParts:
    """A prefill unit: pools, transfer engine, and the prefill side of the messenger."""
    from disaggsdk.messenger.prefill_side import ContextStaging, PrefillMessenger

    parts, registrations, context_mr = _kv_unit(PrefillParts, args, spec, plan)
    try:
        parts.messenger = PrefillMessenger(
            parts.info, engine=parts.engine, transfer=parts.transfer, plan=plan, pool_regions=registrations,
            staging=ContextStaging(context_mr, memoryview(parts.context)), secret=args.secret,
            streaming=spec.transfer.streaming, verify_pages=spec.transport.verify_pages,
        )
    except BaseException:
        parts.close()
        raise
    return parts


def assemble_decode(args: Any, spec: Any, plan: Any) -> UnitParts:
    """A decode unit: pools, transfer engine, and the decode side of the messenger."""
    from disaggsdk.messenger.decode_side import DecodeMessenger

    parts, registrations, context_mr = _kv_unit(DecodeParts, args, spec, plan)
    try:
        parts.messenger = DecodeMessenger(
            parts.info, parts.engine, parts.transfer, plan, memoryview(parts.context), args.secret,
            deadline_s=spec.transfer.deadline_s, pools=registrations, context_region=context_mr,
            grant_keys=spec.transport.grant_keys_on(args.provider), verify_pages=spec.transport.verify_pages)
    except BaseException:
        parts.close()
        raise
    return parts


def _kv_unit(kind: type[UnitParts], args: Any, spec: Any, plan: Any) -> tuple[UnitParts, list, Any]:
    """An engine over memfd pools (rank 0's here, the workers' handed over), all registered with one
    transfer engine, and the context slots. Returns the parts, the pool registrations and the
    context buffer's registration."""
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.memory.pool_handover import PoolCollector
    from disaggsdk.memory.shared_memory import SharedRegion
    from disaggsdk.messenger.context import context_bytes
    from disaggsdk.transfer import TransferEngine

    tp = plan.instance(args.instance).tp
    share_path = os.path.join(args.work_dir, f"{args.name}.kv.sock") if tp > 1 else None
    config = EngineConfig.from_spec(spec, tp=tp, role=args.role, kv_share_path=share_path)
    print(f"{args.name}: building {spec.model} tp={tp} mode={config.mode}", flush=True)
    region0 = SharedRegion.create(_pool_bytes(plan, config, tp), f"{args.name}-kv-rank0")
    parts = kind(engine=None, info=unit_info(args), regions=[region0])
    try:
        collector = PoolCollector(share_path, tp - 1) if share_path else None
        try:
            parts.engine = LLMEngine(spec.model, config, kv_buffer=region0.buffer)
            if parts.engine.runner.compiled is not None:
                print(f"{args.name}: compiled its step (torch.compile)", flush=True)
            if collector is not None:
                workers = collector.wait(timeout_s=60)
                parts.regions += [workers[r] for r in range(1, tp)]
        finally:
            if collector is not None:
                collector.close()
        parts.transfer = TransferEngine(args.provider, direct=spec.transport.same_host_copy)
        # Peers write only into a decode unit's pools and context, and there only under the
        # whole-region key when grant keys are off; a prefill unit's regions are write sources.
        targets = args.role == "decode" and not spec.transport.grant_keys_on(args.provider)
        # pools are memfds: prefill units on this machine map a target's and copy with memcpy
        registrations = [parts.transfer.register(r.buffer, shared_fd=r.fd if targets else None, remote_write=targets)
                         for r in parts.regions]
        parts.registrations = list(registrations)
        slot_bytes = context_bytes(plan.arch.hidden_size, plan.arch.vocab_size)
        parts.context = bytearray(slot_bytes * args.num_context_slots)
        context_mr = parts.transfer.register(parts.context, remote_write=targets)
        parts.registrations = [*registrations, context_mr]
        parts.info = unit_info(args, parts.transfer.address, [m.descriptor.to_bytes() for m in registrations],
                               context_mr.descriptor.to_bytes(), slot_bytes)
    except BaseException:
        parts.close()
        raise
    return parts, registrations, context_mr


def _pool_bytes(plan: Any, config: EngineConfig, tp: int) -> int:
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.models import kv_geometry
    from disaggsdk.engine.parallel import TensorParallel

    # every KV layer of the plan: the model's and, when it drafts with it, the MTP layer's
    geometry = kv_geometry(plan.arch, TensorParallel(0, tp), plan.kv_layers - plan.arch.num_layers)
    return KVCache.page_format(geometry, config.num_pages, config.page_size, config.layout,
                               config.kv_dtype).pool_bytes
