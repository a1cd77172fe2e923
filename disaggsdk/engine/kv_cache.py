"""One rank's paged KV cache: the pool geometry of a model on this rank, over a byte buffer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from disaggsdk.engine.kv_scales import KVScales
from disaggsdk.kv.layout import KVLayoutError, KVPageFormat, KVPool, kv_dtype_name

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.modeling.base import KVGeometry
    from disaggsdk.kv.layout import PoolMemory


class KVCache:
    """The KV pool of one rank, shaped for one model.

    Args:
        geometry: per-rank KV geometry from ``kv_geometry(arch, tp)``.
        num_pages: pages in the pool (the same ids on every rank).
        page_size: tokens per page.
        layout: "HND" (default) or "NHD"; ignored for MLA, whose pages are token-major.
        dtype: cache element type as `$.kv.dtype` names it ("float32", "bfloat16", "float16", "fp8")
            or as torch does ("float8_e4m3fn").
        device: where to allocate when ``buffer`` is None.
        buffer: optional external backing memory of ``KVCache.pool_bytes(...)`` bytes (a uint8
            tensor, or anything ``torch.frombuffer`` accepts), e.g. a shared memfd mapping.
        scales: per-layer fp8 scales (`engine.kv_scales`; read only by an fp8 cache); None: 1.0.
    Raises:
        KVLayoutError: inconsistent geometry, a buffer of the wrong size, or scales for another
            number of layers.
    """

    def __init__(
        self,
        geometry: KVGeometry,
        num_pages: int,
        page_size: int,
        layout: str = "HND",
        dtype: str = "float32",
        device: str = "cpu",
        buffer: PoolMemory | None = None,
        scales: KVScales | None = None,
    ):
        self.geometry = geometry
        self.fmt = self.page_format(geometry, num_pages, page_size, layout, dtype)
        self.pool = KVPool(self.fmt, buffer=buffer, device=device)
        self.scales = scales if scales is not None else KVScales.unit(geometry.num_layers)
        if len(self.scales.k) != geometry.num_layers:
            raise KVLayoutError(f"{len(self.scales.k)} KV scales for a pool of {geometry.num_layers} layers")

    @staticmethod
    def page_format(
        geometry: KVGeometry, num_pages: int, page_size: int, layout: str = "HND", dtype: str = "float32"
    ) -> KVPageFormat:
        """The pool format for ``geometry`` (use ``.pool_bytes`` to size an external buffer)."""
        return KVPageFormat(
            num_layers=geometry.num_layers,
            num_pages=num_pages,
            page_size=page_size,
            layout=layout,  # type: ignore[arg-type]
            attention=geometry.attention,
            num_kv_heads_local=geometry.num_kv_heads_local if geometry.attention == "gqa" else 0,
            head_dim=geometry.head_dim if geometry.attention == "gqa" else 0,
            latent_dim=geometry.latent_dim,
            dtype_name=kv_dtype_name(dtype),
        )

    @property
    def page_size(self) -> int:
        return self.fmt.page_size

    @property
    def num_pages(self) -> int:
        return self.fmt.num_pages

    @property
    def layout(self) -> str:
        return self.fmt.layout

    @property
    def dtype(self) -> torch.dtype:
        """The element type the pages hold (float8_e4m3fn for `$.kv.dtype: fp8`)."""
        return self.fmt.dtype

    def k_scale(self, layer_id: int) -> float:
        """The fp8 scale of K (MLA: of the latent) in layer ``layer_id``; 1.0 means none."""
        return self.scales.k[layer_id]

    def v_scale(self, layer_id: int) -> float:
        """The fp8 scale of V in layer ``layer_id`` (MLA: its ``k_scale``)."""
        return self.scales.v[layer_id]

    @property
    def buffer(self) -> torch.Tensor:
        """The whole pool as bytes: [num_layers * num_pages * page_bytes], uint8."""
        return self.pool.buffer

    def k_v(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V pages of a GQA layer in the stored layout (see `KVPool.k_v`)."""
        return self.pool.k_v(layer_id)

    def k_v_token_major(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a GQA layer as [num_pages, page_size, kv_heads_local, head_dim] views."""
        return self.pool.k_v_token_major(layer_id)

    def latent(self, layer_id: int) -> torch.Tensor:
        """The MLA cache of a layer: [num_pages, page_size, kv_lora_rank + qk_rope_head_dim]."""
        return self.pool.latent(layer_id)
