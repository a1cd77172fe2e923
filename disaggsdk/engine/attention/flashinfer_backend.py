"""FlashInfer paged attention (CUDA): the paged prefill and decode wrappers, and the MLA wrapper.

Imported only through the attention registry, so `flashinfer` is needed only when this backend
is chosen. KV stays in our pool: K and V are passed as the strided views of `KVCache.k_v` (HND or
NHD), the MLA cache as the latent and rope slices of its ``[page_size][latent]`` pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from disaggsdk.engine.attention import FLASHINFER_INSTALL, AttentionBackendError, FlashInferMissing
from disaggsdk.engine.kv_scales import to_cache

if TYPE_CHECKING:
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper

    from disaggsdk.engine.compiled_step.cuda_graphs import PaddedDecode
    from disaggsdk.engine.forward_batch import ForwardBatch
    from disaggsdk.engine.kv_cache import KVCache

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's recommended split-k workspace


def _require_flashinfer() -> None:
    """Imports ``flashinfer``: its absence is a `FlashInferMissing` that says what to install, not an ImportError."""
    try:
        import flashinfer  # noqa: F401
    except ImportError as exc:
        raise FlashInferMissing(
            f"the flashinfer attention backend needs the flashinfer package ({exc}): {FLASHINFER_INSTALL}; "
            f"or use attention_backend='torch_ref'"
        ) from None


def _require_cuda(device: torch.device) -> None:
    """FlashInfer's kernels run on CUDA tensors only."""
    if device.type != "cuda":
        raise AttentionBackendError(
            f"the flashinfer backend needs the KV cache on a CUDA device, not {device}; use torch_ref on CPU"
        )


class FlashInferBackend:
    """Paged attention over one rank's `KVCache` with FlashInfer kernels.

    Args:
        kv_cache: the rank's cache, on a CUDA device.
    Raises:
        FlashInferMissing: the flashinfer package cannot be imported.
        AttentionBackendError: a cache that is not on a CUDA device.
    """

    def __init__(self, kv_cache: KVCache):
        _require_flashinfer()
        from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        device = kv_cache.buffer.device
        _require_cuda(device)
        self.kv_cache = kv_cache
        self._workspace = workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        if kv_cache.fmt.attention == "mla":
            self._mla = BatchMLAPagedAttentionWrapper(workspace)
        else:
            self._prefill = BatchPrefillWithPagedKVCacheWrapper(workspace, kv_cache.layout)
            self._decode = BatchDecodeWithPagedKVCacheWrapper(workspace, kv_cache.layout)
        self._page_size = 0  # tokens per page of the planned step
        self._planned_key: tuple | None = None  # (num_q_heads, sm_scale, dtype) of the current plan
        self._is_decode = False
        self._new_page: torch.Tensor | None = None  # [num_tokens], int64
        self._new_offset: torch.Tensor | None = None  # [num_tokens], int64
        self._decode_key: tuple | None = None  # the last eager decode plan's key: what graphs plan with
        # captured batch size -> graph-mode decode wrapper
        self._graph_wrappers: dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self._graph_wrapper: BatchDecodeWithPagedKVCacheWrapper | None = None  # what a replay runs; None: eager

    def plan(self, batch: ForwardBatch) -> None:
        """Keep the step's metadata; the wrapper itself is planned at the step's first `run`."""
        device = self.kv_cache.buffer.device
        self._page_size = batch.page_size
        self._planned_key = None
        self._graph_wrapper = None
        qo = batch.qo_indptr
        self._is_decode = int(qo[-1]) == batch.batch_size  # every request brings one token
        slots = batch.kv_slot_ids.to(device=device, dtype=torch.int64)
        self._new_page = slots // batch.page_size
        self._new_offset = slots % batch.page_size
        self._meta = {
            name: indices.to(device=device, dtype=torch.int32)
            for name, indices in (("qo_indptr", batch.qo_indptr), ("kv_page_indptr", batch.kv_page_indptr),
                                  ("kv_page_indices", batch.kv_page_indices),
                                  ("kv_last_page_len", batch.kv_last_page_len))
        }

    def _plan_gqa(self, num_q_heads: int, sm_scale: float, dtype: torch.dtype) -> None:
        key = (num_q_heads, sm_scale, dtype)
        if key == self._planned_key:
            return
        if self._graph_wrapper is not None:
            raise AttentionBackendError(f"a decode graph was planned for (num_q_heads, sm_scale, dtype) = "
                                        f"{self._planned_key}, but the model runs {key}")
        g = self.kv_cache.geometry
        m = self._meta
        common = dict(sm_scale=sm_scale, q_data_type=dtype, kv_data_type=self.kv_cache.dtype)
        if self._is_decode:
            self._decode.plan(
                m["kv_page_indptr"], m["kv_page_indices"], m["kv_last_page_len"], num_q_heads,
                g.num_kv_heads_local, g.head_dim, self._page_size, **common,
            )
            self._decode_key = key
        else:
            self._prefill.plan(
                m["qo_indptr"], m["kv_page_indptr"], m["kv_page_indices"], m["kv_last_page_len"], num_q_heads,
                g.num_kv_heads_local, g.head_dim, self._page_size, causal=True, **common,
            )
        self._planned_key = key

    def run(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """GQA attention of one layer (see `AttentionBackend.run`).

        Args:
            q: [num_tokens, num_q_heads_local, head_dim], fp16/bf16
            k: [num_tokens, num_kv_heads_local, head_dim], new tokens
            v: [num_tokens, num_kv_heads_local, head_dim], new tokens
            sm_scale: softmax scale
        Returns:
            [num_tokens, num_q_heads_local, head_dim]
        """
        k_tm, v_tm = self.kv_cache.k_v_token_major(layer_id)
        k_scale, v_scale = self.kv_cache.k_scale(layer_id), self.kv_cache.v_scale(layer_id)
        k_tm[self._new_page, self._new_offset] = to_cache(k, k_tm.dtype, k_scale)
        v_tm[self._new_page, self._new_offset] = to_cache(v, v_tm.dtype, v_scale)
        self._plan_gqa(q.shape[1], sm_scale, q.dtype)
        paged = self.kv_cache.k_v(layer_id)  # strided K and V views in the pool's layout
        wrapper: BatchDecodeWithPagedKVCacheWrapper | BatchPrefillWithPagedKVCacheWrapper
        wrapper = self._graph_wrapper or (self._decode if self._is_decode else self._prefill)
        if self.kv_cache.dtype != torch.float8_e4m3fn:
            return wrapper.run(q.contiguous(), paged)
        return wrapper.run(q.contiguous(), paged, k_scale=k_scale, v_scale=v_scale)

    def run_mla(self, layer_id: int, q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor,
                k_rope: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """MLA attention of one layer in absorbed form: `AttentionBackend.run_mla` says the shapes."""
        cache = self.kv_cache.latent(layer_id)  # [num_pages, page_size, kv_lora_rank + rope]
        rank = kv_latent.shape[1]
        scale = self.kv_cache.k_scale(layer_id)  # the latent's and its rope key's one scale
        cache[self._new_page, self._new_offset] = to_cache(torch.cat([kv_latent, k_rope], dim=-1), cache.dtype, scale)
        key = (q_latent.shape[1], sm_scale, q_latent.dtype)
        if key != self._planned_key:
            from flashinfer.mla import MLAPlanMetadata

            m = self._meta
            page_size = self._page_size
            num_pages = m["kv_page_indptr"][1:] - m["kv_page_indptr"][:-1]
            kv_len = (num_pages - 1) * page_size + m["kv_last_page_len"]
            # by keyword, with the page table as one metadata value: FlashInfer 0.7 deprecates the
            # positional and flat-tensor forms. "split": the query and the cache come as (latent,
            # rope) pairs, as the flat form implied
            self._mla.plan(
                metadata=MLAPlanMetadata.csr(qo_indptr=m["qo_indptr"], kv_indptr=m["kv_page_indptr"],
                                             kv_indices=m["kv_page_indices"], kv_len_arr=kv_len.to(torch.int32)),
                num_heads=q_latent.shape[1], head_dim_ckv=rank, head_dim_kpe=k_rope.shape[1], page_size=page_size,
                causal=True, sm_scale=sm_scale, q_data_type=q_latent.dtype, kv_data_type=self.kv_cache.dtype,
                query_layout="split", kv_cache_layout="split",
            )
            self._planned_key = key
        query = (q_latent.contiguous(), q_rope.contiguous())
        kv_pages = (cache[..., :rank], cache[..., rank:])  # adjacent slices of one page: no copy
        if self.kv_cache.dtype != torch.float8_e4m3fn:
            return self._mla.run(query=query, kv_cache=kv_pages)
        return self._mla.run(query=query, kv_cache=kv_pages, ckv_scale=scale, kpe_scale=scale)

    # CUDA-graph decode (engine.compiled_step.cuda_graphs)

    @property
    def supports_decode_graphs(self) -> bool:
        """Whether decode steps can run as CUDA graphs here: GQA caches (the MLA wrapper is not
        wired for graph mode yet)."""
        return self.kv_cache.fmt.attention != "mla"

    def prepare_decode_graphs(self, batch_sizes: Sequence[int], max_num_page_ids: int) -> None:
        """Make a graph-mode decode wrapper for each captured batch size, over shared buffers.

        Args:
            batch_sizes: the captured sizes.
            max_num_page_ids: the longest padded page list a step may hold.
        """
        from flashinfer import BatchDecodeWithPagedKVCacheWrapper

        device = self.kv_cache.buffer.device
        largest = max(batch_sizes)
        self._graph_kv_page_indptr = torch.zeros(largest + 1, dtype=torch.int32, device=device)  # [largest + 1]
        self._graph_kv_page_indices = torch.zeros(max_num_page_ids, dtype=torch.int32, device=device)
        self._graph_kv_last_page_len = torch.zeros(largest, dtype=torch.int32, device=device)  # [largest]
        self._graph_new_page = torch.zeros(largest, dtype=torch.int64, device=device)  # [largest]
        self._graph_new_offset = torch.zeros(largest, dtype=torch.int64, device=device)  # [largest]
        self._graph_wrappers = {
            size: BatchDecodeWithPagedKVCacheWrapper(
                self._workspace, self.kv_cache.layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self._graph_kv_page_indptr[:size + 1],
                paged_kv_indices_buffer=self._graph_kv_page_indices,
                paged_kv_last_page_len_buffer=self._graph_kv_last_page_len[:size],
            )
            for size in batch_sizes
        }

    def plan_decode_graph(self, padded: PaddedDecode) -> None:
        """Plan a padded decode step for the graph of its size (on the host, before the replay):
        FlashInfer's graph-mode wrapper copies the page table into its buffers, and the new tokens'
        KV slots go to the fixed index buffers the captured writes read.

        Raises:
            AttentionBackendError: no eager decode step ran yet (nothing to plan with), or
                `prepare_decode_graphs` made no wrapper of this size.
        """
        if self._decode_key is None:
            raise AttentionBackendError("plan_decode_graph needs one eager decode step first: its head count, "
                                        "softmax scale and dtype are what the graph is planned with")
        if padded.batch_size not in self._graph_wrappers:
            raise AttentionBackendError(f"no decode graph wrapper of batch size {padded.batch_size}; made: "
                                        f"{sorted(self._graph_wrappers)}")
        num_q_heads, sm_scale, dtype = self._decode_key
        g = self.kv_cache.geometry
        page_size = self.kv_cache.page_size
        wrapper = self._graph_wrappers[padded.batch_size]
        wrapper.plan(padded.kv_page_indptr, padded.kv_page_indices, padded.kv_last_page_len, num_q_heads,
                     g.num_kv_heads_local, g.head_dim, page_size, sm_scale=sm_scale, q_data_type=dtype,
                     kv_data_type=self.kv_cache.dtype)
        size = padded.batch_size
        self._graph_new_page[:size].copy_(padded.kv_slot_ids // page_size)
        self._graph_new_offset[:size].copy_(padded.kv_slot_ids % page_size)
        self._new_page, self._new_offset = self._graph_new_page[:size], self._graph_new_offset[:size]
        self._page_size = page_size
        self._is_decode = True
        self._planned_key = self._decode_key
        self._graph_wrapper = wrapper
