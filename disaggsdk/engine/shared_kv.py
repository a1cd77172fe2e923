"""A tensor-parallel worker's KV pool in shareable memory, its fd handed to the instance head.

One transfer engine on the head process registers every rank's pool (docs/architecture.md, "Shared
KV memory"). A worker started with ``EngineConfig.kv_share_path`` allocates its pool on its device
(a memfd on the CPU, a cuMem allocation on a GPU: `disaggsdk.kv.pools`), connects to that
Unix socket, sends its tp rank (4 bytes) and then the fd (SCM_RIGHTS), and keeps the pool for the
model runner. The protocol is `disaggsdk.kv.pools.pool_handover`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.model_runner import RunnerConfig
    from disaggsdk.engine.parallel import TensorParallel
    from disaggsdk.kv.pools.base import RankPool


def pool_bytes(config: RunnerConfig, tp: TensorParallel) -> int:
    """Bytes of this rank's KV pool under ``config``."""
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.modeling import kv_geometry
    from disaggsdk.models import resolve_model

    geometry = kv_geometry(resolve_model(config.model), tp, config.extra_kv_layers)
    engine = config.engine
    return KVCache.page_format(geometry, engine.num_pages, engine.page_size, engine.layout, config.kv_dtype).pool_bytes


def share_pool(config: RunnerConfig, tp: TensorParallel) -> RankPool:
    """Create this rank's pool on its device and send it to the head at ``config.engine.kv_share_path``.

    Returns:
        The pool (keep it alive as long as the model runner uses it; `pool_tensor` is its KV buffer).
    Raises:
        SharedKVError: the head is not listening or went away.
        SharedMemoryError: the pool cannot be allocated (CudaDriverMissing: no CUDA driver or cuda-python).
    """
    from disaggsdk.kv.pools import create_rank_pool
    from disaggsdk.kv.pools.pool_handover import SharedKVError, send_pool

    path = config.engine.kv_share_path
    assert path is not None, "only a worker told where to hand its pool shares it"
    region = create_rank_pool(pool_bytes(config, tp), config.engine.device, f"disaggsdk-kv-rank{tp.rank}")
    try:
        send_pool(path, tp.rank, region)
    except SharedKVError:
        region.close()
        raise
    return region


def pool_tensor(pool: RankPool, size_bytes: int) -> torch.Tensor:
    """The first ``size_bytes`` of ``pool`` as a uint8 tensor on its device: the engine's KV buffer (a CUDA
    pool is rounded up to its allocation granularity; the KV cache wants its format's exact size)."""
    return pool.as_tensor()[:size_bytes]
