"""Torch views of one rank's KV pool buffer: ``[num_layers][num_pages][page_bytes]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    import torch
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

    # Memory a KV pool can live in: a torch uint8 tensor, or a writable buffer (mmap, bytearray, memoryview)
    PoolMemory: TypeAlias = "torch.Tensor | Buffer"

Layout = Literal["HND", "NHD"]
LAYOUTS = ("HND", "NHD")

# The spec's `$.kv.dtype` names -> the torch dtype attribute the pool stores: the one place the two
# vocabularies meet. "fp8" is OCP e4m3 (vLLM's kv_cache_dtype=fp8, FlashInfer's float8_e4m3fn):
# one byte an element, values stored divided by a per-layer scale (engine.kv_scales).
KV_DTYPE_NAMES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "fp8": "float8_e4m3fn"}


class KVLayoutError(DisaggError):
    """A KV pool geometry or backing buffer is inconsistent."""


def kv_dtype_name(name: str) -> str:
    """The torch dtype attribute name of a KV element type, given as the spec names it (`$.kv.dtype`:
    float32, bfloat16, float16, fp8) or already as a torch name (float8_e4m3fn).

    Raises:
        KVLayoutError: a name that is neither.
    """
    if name in KV_DTYPE_NAMES:
        return KV_DTYPE_NAMES[name]
    if name in KV_DTYPE_NAMES.values():
        return name
    raise KVLayoutError(f"unknown KV dtype {name!r}; set kv.dtype to one of {sorted(KV_DTYPE_NAMES)}")


@dataclass(frozen=True)
class KVPageFormat:
    """The shape of one rank's KV pool.

    For GQA, ``num_kv_heads_local`` and ``head_dim`` describe K and V and ``latent_dim`` is 0; for
    MLA, ``latent_dim = kv_lora_rank + qk_rope_head_dim`` and the head fields are unused.
    """

    num_layers: int
    num_pages: int
    page_size: int  # tokens per page
    layout: Layout = "HND"
    attention: Literal["gqa", "mla"] = "gqa"
    num_kv_heads_local: int = 0
    head_dim: int = 0
    latent_dim: int = 0
    dtype_name: str = "float32"  # a torch dtype attribute name: a value of KV_DTYPE_NAMES

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise KVLayoutError(f"unknown KV layout {self.layout!r}; use one of {LAYOUTS}")
        if self.num_layers < 1 or self.num_pages < 1 or self.page_size < 1:
            raise KVLayoutError(
                f"num_layers, num_pages and page_size must be >= 1, got "
                f"{self.num_layers}, {self.num_pages}, {self.page_size}"
            )
        if self.attention == "mla" and self.latent_dim < 1:
            raise KVLayoutError("an MLA pool needs latent_dim = kv_lora_rank + qk_rope_head_dim >= 1")
        if self.attention == "gqa" and (self.num_kv_heads_local < 1 or self.head_dim < 1):
            raise KVLayoutError("a GQA pool needs num_kv_heads_local >= 1 and head_dim >= 1")
        if self.dtype_name not in KV_DTYPE_NAMES.values():
            raise KVLayoutError(
                f"unknown KV dtype {self.dtype_name!r}; use one of {sorted(KV_DTYPE_NAMES.values())} "
                f"(kv_dtype_name maps the spec's kv.dtype names: {sorted(KV_DTYPE_NAMES)})"
            )

    @property
    def page_elems(self) -> int:
        """Elements of one layer's page."""
        if self.attention == "mla":
            return self.page_size * self.latent_dim
        return self.num_kv_heads_local * 2 * self.page_size * self.head_dim

    @property
    def elem_bytes(self) -> int:
        """Bytes of one stored element: 4, 2, or 1 for fp8."""
        return self.dtype.itemsize

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype the pages hold."""
        import torch

        dtype = getattr(torch, self.dtype_name)
        assert isinstance(dtype, torch.dtype), "__post_init__ admits only KV_DTYPE_NAMES"
        return dtype

    @property
    def page_bytes(self) -> int:
        """Bytes of one layer's page."""
        return self.page_elems * self.elem_bytes

    @property
    def pool_bytes(self) -> int:
        """Bytes of the whole pool, all layers."""
        return self.num_layers * self.num_pages * self.page_bytes


class KVPool:
    """One rank's KV pool: a byte buffer and typed per-layer views of it.

    Args:
        fmt: the pool geometry.
        buffer: optional backing memory of exactly ``fmt.pool_bytes`` bytes: a torch uint8 tensor
            or anything ``torch.frombuffer`` accepts (a writable mmap, bytearray, memoryview).
            When None the pool allocates its own zeroed tensor on ``device``.
        device: where to allocate when ``buffer`` is None.
    Raises:
        KVLayoutError: the buffer has the wrong size or type.
    """

    def __init__(self, fmt: KVPageFormat, buffer: PoolMemory | None = None, device: str = "cpu"):
        import torch

        self.fmt = fmt
        if buffer is None:
            self.buffer = torch.zeros(fmt.pool_bytes, dtype=torch.uint8, device=device)
        elif isinstance(buffer, torch.Tensor):
            if buffer.dtype != torch.uint8 or not buffer.is_contiguous():
                raise KVLayoutError("an external KV buffer tensor must be contiguous torch.uint8")
            self.buffer = buffer.view(-1)
        else:
            self.buffer = torch.frombuffer(buffer, dtype=torch.uint8)
        if self.buffer.numel() != fmt.pool_bytes:
            raise KVLayoutError(
                f"KV buffer holds {self.buffer.numel()} bytes but the pool needs {fmt.pool_bytes} "
                f"({fmt.num_layers} layers x {fmt.num_pages} pages x {fmt.page_bytes} bytes); "
                f"size the buffer with KVPageFormat.pool_bytes"
            )
        # [num_layers, num_pages, page_elems], fmt.dtype: bytes reinterpreted, no copy
        self.pages = self.buffer.view(fmt.num_layers, fmt.num_pages, fmt.page_bytes).view(fmt.dtype)

    def layer_pages(self, layer_id: int) -> torch.Tensor:
        """One layer's pages in their stored shape (a view).

        Returns:
            HND: [num_pages, kv_heads_local, 2, page_size, head_dim];
            NHD: [num_pages, page_size, kv_heads_local, 2, head_dim];
            MLA: [num_pages, page_size, latent_dim].
        """
        f = self.fmt
        flat = self.pages[layer_id]
        if f.attention == "mla":
            return flat.view(f.num_pages, f.page_size, f.latent_dim)
        if f.layout == "HND":
            return flat.view(f.num_pages, f.num_kv_heads_local, 2, f.page_size, f.head_dim)
        return flat.view(f.num_pages, f.page_size, f.num_kv_heads_local, 2, f.head_dim)

    def k_v(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer as strided views in the layout's own order.

        Returns:
            (k, v), each HND: [num_pages, kv_heads_local, page_size, head_dim] or
            NHD: [num_pages, page_size, kv_heads_local, head_dim] -- what FlashInfer takes.
        """
        if self.fmt.attention == "mla":
            raise KVLayoutError("an MLA pool has no separate K and V; use latent(layer_id)")
        pages = self.layer_pages(layer_id)
        if self.fmt.layout == "HND":
            return pages[:, :, 0], pages[:, :, 1]
        return pages[:, :, :, 0], pages[:, :, :, 1]

    def k_v_token_major(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of one layer indexed ``[page, offset]`` whatever the layout (views).

        Returns:
            (k, v), each [num_pages, page_size, kv_heads_local, head_dim]
        """
        k, v = self.k_v(layer_id)
        if self.fmt.layout == "HND":
            return k.transpose(1, 2), v.transpose(1, 2)
        return k, v

    def latent(self, layer_id: int) -> torch.Tensor:
        """The MLA cache of one layer: [num_pages, page_size, kv_lora_rank + qk_rope_head_dim]."""
        if self.fmt.attention != "mla":
            raise KVLayoutError("a GQA pool has no latent; use k_v(layer_id)")
        return self.layer_pages(layer_id)
