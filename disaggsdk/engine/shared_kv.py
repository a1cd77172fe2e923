"""A tensor-parallel worker's KV pool in shared memory, its fd handed to the instance head.

One transfer engine on the head process registers every rank's pool (docs/architecture.md, "Shared
KV memory"). A worker started with ``EngineConfig.kv_share_path`` allocates its pool as a memfd,
connects to that Unix socket, sends its tp rank (4 bytes) and then the fd (SCM_RIGHTS), and keeps
the region for the model runner. The protocol is `disaggsdk.memory.pool_handover`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disaggsdk.engine.model_runner import RunnerConfig
    from disaggsdk.engine.parallel import TensorParallel
    from disaggsdk.memory.shared_memory import SharedRegion


def pool_bytes(config: RunnerConfig, tp: TensorParallel) -> int:
    """Bytes of this rank's KV pool under ``config``."""
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.models import kv_geometry
    from disaggsdk.models import resolve_model

    geometry = kv_geometry(resolve_model(config.model), tp, config.extra_kv_layers)
    engine = config.engine
    return KVCache.page_format(geometry, engine.num_pages, engine.page_size, engine.layout, config.kv_dtype).pool_bytes


def share_pool(config: RunnerConfig, tp: TensorParallel) -> SharedRegion:
    """Create this rank's pool as a memfd and send it to the head at ``config.engine.kv_share_path``.

    Returns:
        The region (keep it alive as long as the model runner uses it).
    Raises:
        SharedKVError: the head is not listening or went away.
    """
    from disaggsdk.memory.pool_handover import SharedKVError, send_pool
    from disaggsdk.memory.shared_memory import SharedRegion

    path = config.engine.kv_share_path
    assert path is not None, "only a worker told where to hand its pool shares it"
    region = SharedRegion.create(pool_bytes(config, tp), f"disaggsdk-kv-rank{tp.rank}")
    try:
        send_pool(path, tp.rank, region)
    except SharedKVError:
        region.close()
        raise
    return region

