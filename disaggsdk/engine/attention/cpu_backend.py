"""The CPU engine's attention backend: the torch reference, with decode and prefill done by native kernels."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from disaggsdk.engine.attention import CPU_KERNELS_MODULE
from disaggsdk.engine.attention.torch_ref import TorchRefBackend, _Group, _Queries
from disaggsdk.engine.kv_scales import from_cache, to_cache

if TYPE_CHECKING:
    from disaggsdk.engine.forward_batch import ForwardBatch
    from disaggsdk.engine.kv_cache import KVCache

try:  # the optional native extension (setup.py; `python native/build_cpu_attention.py`)
    _cpu_kernels = importlib.import_module(CPU_KERNELS_MODULE)  # cffi: `ffi` and `lib`
    _kernels_built = True
except ImportError:  # pragma: no cover - depends on the build
    _cpu_kernels = ModuleType(CPU_KERNELS_MODULE)  # an empty stand-in: nothing calls it unbuilt
    _kernels_built = False

# cache dtypes the kernel reads; others (float16) fall back to the reference's decode path
KERNEL_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float8_e4m3fn)
# the kernel's cache_dtype codes (paged_decode.h)
_CACHE_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float8_e4m3fn: 2}


def kernel_available() -> bool:
    """Whether the native decode kernel was built into this install."""
    return _kernels_built


def _ptr(kind: str, t: torch.Tensor) -> object:  # a cffi pointer
    return _cpu_kernels.ffi.cast(kind, t.data_ptr())


def paged_decode(q: torch.Tensor, rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 page_indices: torch.Tensor, page_indptr: torch.Tensor, kv_lens: torch.Tensor, sm_scale: float,
                 out: torch.Tensor, kv_scales: tuple[float, float] = (1.0, 1.0)) -> None:
    """One-query attention of each request over its pages, written into ``out`` (the kernel).

    Args:
        q: [num_tokens, Hq, D] float32, contiguous; request b's query is row ``rows[b]``.
        rows: [B] int64.
        keys: [num_pages, page_size, Hkv, D] token-major view of the layer's K pages (any strides
            with a unit last stride), float32, bfloat16 or float8_e4m3fn.
        values: the same view of V, [..., Dv]; its strides must equal ``keys``'s.
        page_indices, page_indptr: [total_pages] and [B + 1] int64, request b's pages in order.
        kv_lens: [B] int64 tokens of KV per request (after this step's token).
        sm_scale: softmax scale.
        out: [num_tokens, Hq, Dv] float32, contiguous; rows ``rows`` are written.
        kv_scales: (k_scale, v_scale) that float8_e4m3fn keys and values are multiplied by.
    Raises:
        MemoryError: the kernel's scratch could not be allocated.
    """
    assert q.dtype == out.dtype == torch.float32 and q.is_contiguous() and out.is_contiguous()
    assert keys.dtype in KERNEL_CACHE_DTYPES and keys.dtype == values.dtype
    # one set of strides for both (the head stride only matters with more than one kv head:
    # MLA's values are the first columns of its single latent "head")
    assert keys.stride()[:2] == values.stride()[:2] and keys.stride(3) == values.stride(3) == 1
    assert keys.shape[2] == 1 or keys.stride(2) == values.stride(2)
    for t in (rows, page_indices, page_indptr, kv_lens):
        assert t.dtype == torch.int64 and t.is_contiguous()
    _, page_size, num_kv_heads, head_dim = keys.shape
    page_stride, token_stride, head_stride, _ = keys.stride()
    rc = _cpu_kernels.lib.paged_decode_attention(
        _ptr("float *", q), q.stride(0), _ptr("int64_t *", rows), rows.numel(),
        _ptr("void *", keys), _ptr("void *", values), _CACHE_DTYPE_CODES[keys.dtype], kv_scales[0], kv_scales[1],
        page_stride, head_stride, token_stride,
        _ptr("int64_t *", page_indices), _ptr("int64_t *", page_indptr), _ptr("int64_t *", kv_lens),
        page_size, q.shape[1], num_kv_heads, head_dim, values.shape[3], sm_scale,
        _ptr("float *", out), out.stride(0),
    )
    if rc != 0:
        raise MemoryError("paged_decode_attention: scratch allocation failed")


def causal_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor,
                   sm_scale: float, out: torch.Tensor) -> bool:
    """Causal attention of fresh prompts over their own new tokens, written into ``out`` (the kernel).

    Args:
        q: [num_tokens, Hq, D] float32; k: [num_tokens, Hkv, D]; v: [num_tokens, Hkv, Dv]; any
            row stride, heads and dims contiguous within a row.
        starts, lens: [R] int64: prompt r is tokens ``starts[r] : starts[r] + lens[r]``.
        out: [num_tokens, Hq, Dv] float32, same row rule.
    Returns:
        False (``out`` untouched) where the kernel does not apply: head dims over 256, a value dim
        that is not a multiple of 16, more than 8 query heads per kv head, or other dtypes.
    """
    tensors = (q, k, v, out)
    if any(t.dtype != torch.float32 or t.stride(2) != 1 or t.stride(1) != t.shape[2] for t in tensors):
        return False
    rc = _cpu_kernels.lib.causal_prefill_attention(
        _ptr("float *", q), q.stride(0), _ptr("float *", k), k.stride(0), _ptr("float *", v), v.stride(0),
        _ptr("int64_t *", starts), _ptr("int64_t *", lens), starts.numel(), q.shape[1], k.shape[1], q.shape[2],
        v.shape[2], sm_scale, _ptr("float *", out), out.stride(0),
    )
    return _prefill_ran(rc, "causal_prefill_attention")


def prefix_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_prefix: int, sm_scale: float,
                   out: torch.Tensor) -> bool:
    """Causal attention of one chunk's queries over ``num_prefix`` earlier keys and their own (the kernel).

    Args:
        q: [num_q, Hq, D] float32; k: [num_prefix + num_q, Hkv, D]; v: [num_prefix + num_q, Hkv, Dv];
            any row stride, heads and dims contiguous within a row.
        out: [num_q, Hq, Dv] float32, same row rule.
    Returns:
        False (``out`` untouched) where the kernel does not apply (as `causal_prefill`).
    """
    tensors = (q, k, v, out)
    if any(t.dtype != torch.float32 or t.stride(2) != 1 or t.stride(1) != t.shape[2] for t in tensors):
        return False
    rc = _cpu_kernels.lib.prefix_prefill_attention(
        _ptr("float *", q), q.stride(0), _ptr("float *", k), k.stride(0), _ptr("float *", v), v.stride(0),
        q.shape[0], num_prefix, q.shape[1], k.shape[1], q.shape[2], v.shape[2], sm_scale, _ptr("float *", out),
        out.stride(0),
    )
    return _prefill_ran(rc, "prefix_prefill_attention")


def _prefill_ran(rc: int, kernel: str) -> bool:
    """True where a prefill kernel ran; False where it declined (-1); raises where its scratch (the
    transposed keys) could not be allocated (-2), as the decode kernel does."""
    if rc == -2:
        raise MemoryError(f"{kernel}: scratch allocation failed")
    return rc == 0


class CpuBackend(TorchRefBackend):
    """`TorchRefBackend` with every decode request of a step attended by the native kernel.

    Args:
        kv_cache: the rank's cache (on the CPU).
    Raises:
        RuntimeError: the native extension is missing (choose ``torch_ref``; `default_backend` does).
    """

    def __init__(self, kv_cache: KVCache):
        if not _kernels_built:
            raise RuntimeError("the CPU attention kernel is not built (pip install -e . builds it)")
        super().__init__(kv_cache)
        self._kernel_ok = kv_cache.dtype in KERNEL_CACHE_DTYPES
        # rows, page_indices, page_indptr, kv_lens of the decode kernel's call
        self._decode: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._new_slots = torch.empty(0, dtype=torch.int64)  # [num_tokens] int64: page * page_size + offset

    def plan(self, batch: ForwardBatch) -> None:
        """As `TorchRefBackend.plan`; a decode-only step from tensors alone, no loop over requests."""
        self._decode = None
        if not self._kernel_ok or batch.num_tokens != batch.batch_size:
            super().plan(batch)
            return
        self._plan_new_tokens(batch)
        self._groups = []
        indptr = batch.kv_page_indptr.to(torch.int64)
        kv_lens = (indptr[1:] - indptr[:-1] - 1) * batch.page_size + batch.kv_last_page_len.to(torch.int64)
        rows = torch.arange(batch.batch_size, dtype=torch.int64)
        self._decode = (rows, batch.kv_page_indices.to(torch.int64).contiguous(), indptr.contiguous(), kv_lens)

    def _plan_decodes(self, decode: list[_Queries], page_size: int, device: torch.device) -> list[_Group]:
        if not self._kernel_ok or not decode:
            self._decode = None
            return super()._plan_decodes(decode, page_size, device)
        indptr = [0]
        for _, _, pages, _ in decode:
            indptr.append(indptr[-1] + len(pages))
        self._decode = (
            torch.tensor([r[0] for r in decode], dtype=torch.int64),
            torch.tensor([p for r in decode for p in r[2]], dtype=torch.int64),
            torch.tensor(indptr, dtype=torch.int64),
            torch.tensor([r[3] for r in decode], dtype=torch.int64),
        )
        return []

    def _attend_fresh(self, g: _Group, q: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor,
                      sm_scale: float, out: torch.Tensor) -> None:
        starts = g.rows[:, 0].contiguous()
        lens = torch.full_like(starts, g.rows.shape[1])
        if not causal_prefill(q, new_keys, new_values, starts, lens, sm_scale, out):
            super()._attend_fresh(g, q, new_keys, new_values, sm_scale, out)

    def _attend_chunks(self, g: _Group, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       token_major: bool, out: torch.Tensor, sm_scale: float, kv_scales: tuple[float, float]) -> bool:
        """Prefill chunks over earlier KV (a prefix-cache hit, a long prompt's later chunks) by the
        kernel, over each request's pages gathered token-major once: no [q, kv] mask (fp8 pages
        dequantized to float32 in that copy)."""
        if not self._kernel_ok or q.dtype != torch.float32:
            return False
        page_size = keys.shape[1] if token_major else keys.shape[2]
        fp8 = keys.dtype == torch.float8_e4m3fn
        assert g.page_table is not None, "chunks over earlier KV are a paged group"
        for b, (q_start, q_len, kv_len) in enumerate(g.spans):
            pages = g.page_table[b, : -(-kv_len // page_size)]
            k = _token_rows(keys, pages, token_major)[:kv_len]
            v = _token_rows(values, pages, token_major)[:kv_len]
            if fp8:
                k, v = from_cache(k, torch.float32, kv_scales[0]), from_cache(v, torch.float32, kv_scales[1])
            rows = slice(q_start, q_start + q_len)
            if not prefix_prefill(q[rows], k, v, kv_len - q_len, sm_scale, out[rows]):
                return False  # the same shapes for every request: none was written
        return True

    def _decode_only(self) -> bool:
        """Whether every query of the planned step goes to the decode kernel (no group left)."""
        return self._decode is not None and not self._groups

    def run(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """As `TorchRefBackend.run`; a step the decode kernel takes whole stores the new K/V and calls
        the kernel, nothing else (see `run_mla`)."""
        if not self._decode_only():
            return super().run(layer_id, q, k, v, sm_scale)
        self._store_kv(layer_id, k, v)
        k_tm, v_tm = self.kv_cache.k_v_token_major(layer_id)
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
        self._decode_into(q, k_tm, v_tm, out, sm_scale, self._kv_scales(layer_id))
        return out

    def run_mla(self, layer_id: int, q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor,
                k_rope: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """As `TorchRefBackend.run_mla`. A step the decode kernel takes whole (every decode step; a
        speculative step's verified positions) stores the new latents with one ``index_copy_`` and
        calls the kernel, nothing else: the reference's general path (a two-index store, the fresh
        prompts' keys, the loop over groups) took 61 us a layer call at batch 1, this 49 (a hot
        loop, the kernel ~25 of it)."""
        if not self._decode_only():
            return super().run_mla(layer_id, q_latent, q_rope, kv_latent, k_rope, sm_scale)
        cache = self.kv_cache.latent(layer_id)  # [num_pages, page_size, latent_dim], token-major
        rank = kv_latent.shape[1]
        scale = self.kv_cache.k_scale(layer_id)
        new = to_cache(torch.cat([kv_latent, k_rope], dim=-1), cache.dtype, scale)
        rows = cache.view(-1, cache.shape[2])
        if new.dtype == torch.float8_e4m3fn:  # torch has no index_copy_ for fp8: copy the bytes
            rows, new = rows.view(torch.uint8), new.view(torch.uint8)
        rows.index_copy_(0, self._new_slots, new)
        q = torch.cat([q_latent, q_rope], dim=-1)
        out = torch.empty(q.shape[0], q.shape[1], rank, dtype=q.dtype)
        self._decode_into(q, cache.unsqueeze(2), cache[..., :rank].unsqueeze(2), out, sm_scale, (scale, scale))
        return out

    def _plan_new_tokens(self, batch: ForwardBatch) -> None:
        super()._plan_new_tokens(batch)
        self._new_slots = batch.kv_slot_ids.to(torch.int64)

    def _decode_into(self, q: torch.Tensor, k_tm: torch.Tensor, v_tm: torch.Tensor, out: torch.Tensor,
                     sm_scale: float, kv_scales: tuple[float, float]) -> None:
        """The planned decode queries' rows of ``out`` by the kernel, over token-major K/V views
        (fp8 ones read with ``kv_scales``, (k_scale, v_scale))."""
        assert self._decode is not None, "a decode-only step"
        rows, page_indices, page_indptr, kv_lens = self._decode
        if q.dtype == torch.float32:
            paged_decode(q.contiguous(), rows, k_tm, v_tm, page_indices, page_indptr, kv_lens, sm_scale, out,
                         kv_scales)
        else:  # a bfloat16 model: the kernel computes in float32
            out_f32 = torch.empty(out.shape, dtype=torch.float32)
            paged_decode(q.float(), rows, k_tm, v_tm, page_indices, page_indptr, kv_lens, sm_scale, out_f32,
                         kv_scales)
            out[rows] = out_f32[rows].to(out.dtype)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, token_major: bool, out: torch.Tensor,
                sm_scale: float, new_keys: torch.Tensor, new_values: torch.Tensor,
                kv_scales: tuple[float, float]) -> torch.Tensor:
        if self._decode is not None:
            k_tm = keys if token_major else keys.transpose(1, 2)
            v_tm = values if token_major else values.transpose(1, 2)
            self._decode_into(q, k_tm, v_tm, out, sm_scale, kv_scales)
        return super()._attend(q, keys, values, token_major, out, sm_scale, new_keys, new_values, kv_scales)


def _token_rows(cache: torch.Tensor, pages: torch.Tensor, token_major: bool) -> torch.Tensor:
    """[len(pages) * page_size, H, D], contiguous: the pages' tokens in order, from pages stored
    [pages, P, H, D] (token_major: one index_select) or [pages, H, P, D] (plus one transposing copy)."""
    g = cache.index_select(0, pages)
    if not token_major:
        g = g.transpose(1, 2).contiguous()
    return g.view(-1, g.shape[2], g.shape[3])
