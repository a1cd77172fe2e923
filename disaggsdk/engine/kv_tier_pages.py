"""What a rank's KV tiers keep of a page: its bytes over every layer of the pool, copied out and back.

`PoolPages` is the copier the prefix cache calls (`kv.prefix_cache.PageBytes`); `open_tiers` builds
the `TierStack` of a unit's `engine.tier_settings.TierSettings` that an engine's prefix cache uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.tier_settings import TierSettings
    from disaggsdk.kv.tiers.page_entry import PageIdentity
    from disaggsdk.kv.tiers.tier_stack import TierStack


class PoolPages:
    """Page ``i`` of every layer of one rank's pool as one byte string (layer 0's bytes first).

    On a GPU the copy goes through one pinned host page, so a tier's write does not wait on pageable
    memory; on a CPU it is two memcpys of the page's bytes.
    """

    def __init__(self, cache: KVCache):
        fmt = cache.fmt
        self.page_bytes = fmt.num_layers * fmt.page_bytes  # of one page over every layer
        self._pages = cache.buffer.view(fmt.num_layers, fmt.num_pages, fmt.page_bytes)
        on_gpu = cache.buffer.device.type == "cuda"
        self._staging = torch.empty((fmt.num_layers, fmt.page_bytes), dtype=torch.uint8, pin_memory=on_gpu)

    def read(self, page_id: int) -> bytes:
        """The page's bytes, every layer's in order."""
        self._staging.copy_(self._pages[:, page_id])
        return self._staging.numpy().tobytes()

    def write(self, page_id: int, data: bytes | memoryview) -> None:
        """Put ``data`` (from `read`, of this pool's format) into the page.

        Raises:
            ValueError: ``data`` is not one page of this pool.
        """
        if len(data) != self.page_bytes:
            raise ValueError(f"a page of this pool is {self.page_bytes} bytes, got {len(data)}")
        self._staging.view(-1).copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self._pages[:, page_id].copy_(self._staging)


def page_identity(settings: TierSettings, cache: KVCache, tp_rank: int, tp_size: int) -> PageIdentity:
    """What a page of ``cache`` means, as a tier entry records it (a page under another one is never loaded)."""
    from disaggsdk.kv.tiers.page_entry import PageIdentity

    fmt = cache.fmt
    return PageIdentity(
        model=settings.model_identity, layout="MLA" if fmt.attention == "mla" else fmt.layout, dtype=fmt.dtype_name,
        page_size=fmt.page_size, tp_rank=tp_rank, tp_size=tp_size, page_bytes=fmt.num_layers * fmt.page_bytes)


def open_tiers(settings: TierSettings, identity: PageIdentity) -> TierStack:
    """The tiers ``settings`` turn on, fastest first (host, disk, store)."""
    from disaggsdk.kv.tiers.base import KVTier
    from disaggsdk.kv.tiers.disk_tier import DiskTier
    from disaggsdk.kv.tiers.host_tier import HostTier
    from disaggsdk.kv.tiers.store_tier import StoreTier
    from disaggsdk.kv.tiers.tier_stack import TierStack

    tiers: list[KVTier] = []
    if settings.host_bytes:
        tiers.append(HostTier(settings.host_bytes))
    if settings.disk_bytes:
        tiers.append(DiskTier(settings.disk_dir, settings.disk_bytes))
    if settings.store_address is not None:
        tiers.append(StoreTier(settings.store_address, settings.store_bytes, namespace="disaggsdk-kv"))
    return TierStack(identity, tiers, settings.write_policy)
