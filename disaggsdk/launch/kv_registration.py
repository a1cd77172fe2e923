"""A prefill or decode unit's KV pools as its transport sees them: registered where they are, or
staged through host mirrors.

Each tp rank's pool is a `RankPool` (a memfd on the CPU, a cuMem allocation on a GPU) mapped in
the unit's head. Host pools are registered as they are. A GPU pool is registered as device memory
(FI_HMEM_CUDA) when the provider can, else each rank gets a host mirror that is registered
instead and `HostMirror` copies pages across (`$.transport.kv_staging`; docs/gpu.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from disaggsdk.kv.pools.shared_memory import SharedRegion

if TYPE_CHECKING:
    from disaggsdk.kv.pools.base import RankPool
    from disaggsdk.kv.pools.host_mirror import HostMirror
    from disaggsdk.spec.types import Spec
    from disaggsdk.transfer import MemoryRegion, TransferEngine


@dataclass
class UnitPools:
    """What the transport registered of a unit's pools, and how pages reach it."""

    transfer: TransferEngine
    registrations: list[MemoryRegion]  # one per tp rank: the pool itself, or its mirror
    mode: Literal["host", "device", "mirror"]  # host pools as they are; GPU pools by FI_HMEM; through host copies
    reason: str  # why this mode, for the unit's start-up log
    staging: HostMirror | None = None  # set in "mirror" mode
    mirrors: list[SharedRegion] = field(default_factory=list)  # the host mirrors ("mirror" mode)


def register_pools(spec: Spec, provider: str, pools: Sequence[RankPool], size_bytes: int, num_layers: int,
                   num_pages: int, remote_write: bool, domain: str | None = None) -> UnitPools:
    """Open the unit's transfer engine and register each rank's pool, or its host mirror.

    Args:
        spec: the deployment (``$.transport.kv_staging``, ``$.transport.same_host_copy``).
        provider: the libfabric provider the unit resolved.
        pools: each tp rank's pool, mapped here.
        size_bytes: bytes of one pool's format (a CUDA pool may be rounded up beyond it).
        num_layers: KV layers per pool; num_pages: pages per layer.
        remote_write: peers write into these pools (a decode unit without grant keys).
        domain: the libfabric domain (for tcp the interface) the endpoint opens on; None: the
            provider's default (`transfer.TransferEngine`).
    Raises:
        TransferError: the provider cannot open an endpoint, or refuses a registration it must make
            (``kv_staging: direct`` with GPU pools it cannot register).
    """
    from disaggsdk.plan.kv_staging import mirror_wanted
    from disaggsdk.transfer import TransferEngine, TransferError

    wanted = mirror_wanted(spec)  # what the plan said; None: whether the provider registers GPU memory
    direct = spec.transport.same_host_copy
    if wanted is True:
        transfer = TransferEngine(provider, domain, direct=direct)
        return _mirrored(transfer, pools, size_bytes, num_layers, num_pages, remote_write,
                         "transport.kv_staging is host")
    on_gpu = pools[0].cuda_device is not None
    try:
        transfer = TransferEngine(provider, domain, direct=direct, hmem=on_gpu)
    except TransferError as exc:
        if wanted is False:
            raise
        transfer = TransferEngine(provider, domain, direct=direct)
        return _mirrored(transfer, pools, size_bytes, num_layers, num_pages, remote_write,
                         f"{provider} offers no FI_HMEM endpoint ({exc})")
    registrations: list[MemoryRegion] = []
    try:
        for pool in pools:
            registrations.append(register_rank_pool(transfer, pool, size_bytes, remote_write))
    except TransferError as exc:
        for registration in registrations:
            transfer.deregister(registration)
        if wanted is False:
            transfer.close()
            raise
        return _mirrored(transfer, pools, size_bytes, num_layers, num_pages, remote_write,
                         f"{provider} cannot register CUDA memory ({exc})")
    if on_gpu:
        return UnitPools(transfer, registrations, "device", f"{provider} registers CUDA memory (FI_HMEM_CUDA)")
    return UnitPools(transfer, registrations, "host", "host pools")


def register_rank_pool(transfer: TransferEngine, pool: RankPool, size_bytes: int, remote_write: bool) -> MemoryRegion:
    """One pool's registration: a memfd as a buffer (shareable with same-host peers when written into),
    a CUDA pool by address as device memory."""
    if isinstance(pool, SharedRegion):
        return transfer.register(pool.buffer, shared_fd=pool.fd if remote_write else None, remote_write=remote_write)
    from disaggsdk.kv.pools.cuda_vmm import CudaSharedAllocation, CudaSharedMapping

    assert isinstance(pool, (CudaSharedAllocation, CudaSharedMapping)), "a RankPool is host or cuMem memory"
    return transfer.register_pointer(pool.address, size_bytes, cuda_device=pool.device, keepalive=pool,
                                     remote_write=remote_write)


def _mirrored(transfer: TransferEngine, pools: Sequence[RankPool], size_bytes: int, num_layers: int, num_pages: int,
              remote_write: bool, reason: str) -> UnitPools:
    """Host mirrors for ``pools``, registered, and the staging that copies pages across."""
    from disaggsdk.engine.shared_kv import pool_tensor
    from disaggsdk.kv.pools.host_mirror import HostMirror

    mirrors: list[SharedRegion] = []
    registrations: list[MemoryRegion] = []
    try:
        for rank in range(len(pools)):
            mirror = SharedRegion.create(size_bytes, f"disaggsdk-kv-mirror-rank{rank}")
            mirrors.append(mirror)
            registrations.append(register_rank_pool(transfer, mirror, size_bytes, remote_write))
        staging = HostMirror([pool_tensor(p, size_bytes) for p in pools], [m.as_tensor() for m in mirrors],
                             num_layers, num_pages)
    except BaseException:
        for registration in registrations:
            transfer.deregister(registration)
        transfer.close()
        raise
    return UnitPools(transfer, registrations, "mirror", reason, staging, mirrors)
