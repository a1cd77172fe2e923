"""The reference paged attention backend in plain torch: any device, HND / NHD, GQA and MLA.

It is the oracle the FlashInfer backend and the models are checked against, and the CPU engine's
backend. `plan` turns the step's FlashInfer-style metadata into gather indices and masks once;
`run` stores the new tokens' KV in the pages and attends with `scaled_dot_product_attention`:
all one-token (decode) requests in one padded call, each prefill chunk in a call of its own (a
padded call for mixed lengths would waste memory on [batch, max_q, max_kv] masks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from disaggsdk.engine.forward_batch import ForwardBatch
    from disaggsdk.engine.kv_cache import KVCache


@dataclass
class _Group:
    """Requests attended in one SDPA call."""

    rows: torch.Tensor  # [B, max_q], int64, token rows of each request's queries (padded with 0)
    row_mask: torch.Tensor | None  # [B, max_q], bool, real query rows; None when none are padding
    kv_page: torch.Tensor  # [B, max_kv], int64, page id of each KV position (padded with 0)
    kv_offset: torch.Tensor  # [B, max_kv], int64, offset inside that page
    attn_mask: torch.Tensor  # [B, 1, max_q, max_kv], bool, True where the query may attend


class TorchRefBackend:
    """Paged attention over one rank's `KVCache` in plain torch.

    Args:
        kv_cache: the rank's cache; `run` writes into it.
    """

    def __init__(self, kv_cache: KVCache):
        self.kv_cache = kv_cache
        self._groups: list[_Group] = []
        self._new_page: torch.Tensor | None = None  # [num_tokens], int64
        self._new_offset: torch.Tensor | None = None  # [num_tokens], int64
        self._num_tokens = 0

    def plan(self, batch: ForwardBatch) -> None:
        """Build gather indices and causal masks for every layer of this step."""
        device = self.kv_cache.buffer.device
        page_size = batch.page_size
        slots = batch.kv_slot_ids.to(device=device, dtype=torch.int64)
        self._new_page = slots // page_size
        self._new_offset = slots % page_size
        self._num_tokens = batch.num_tokens
        qo = batch.qo_indptr.tolist()
        kv_indptr = batch.kv_page_indptr.tolist()
        last_len = batch.kv_last_page_len.tolist()
        pages = batch.kv_page_indices.to(device=device, dtype=torch.int64)
        decode, prefill = [], []
        for i in range(batch.batch_size):
            num_pages = kv_indptr[i + 1] - kv_indptr[i]
            kv_len = (num_pages - 1) * page_size + last_len[i] if num_pages else 0
            q_len = qo[i + 1] - qo[i]
            assert 0 < q_len <= kv_len, f"request {i}: {q_len} new tokens but KV length {kv_len}"
            req = (qo[i], q_len, pages[kv_indptr[i] : kv_indptr[i + 1]], kv_len)
            (decode if q_len == 1 else prefill).append(req)
        self._groups = [self._group(reqs, page_size, device) for reqs in ([decode] if decode else [])]
        self._groups += [self._group([req], page_size, device) for req in prefill]

    @staticmethod
    def _group(reqs: list, page_size: int, device: torch.device) -> _Group:
        max_q = max(r[1] for r in reqs)
        max_kv = max(r[3] for r in reqs)
        b = len(reqs)
        rows = torch.zeros(b, max_q, dtype=torch.int64, device=device)
        row_mask = torch.zeros(b, max_q, dtype=torch.bool, device=device)
        kv_page = torch.zeros(b, max_kv, dtype=torch.int64, device=device)
        kv_offset = torch.zeros(b, max_kv, dtype=torch.int64, device=device)
        attn_mask = torch.zeros(b, 1, max_q, max_kv, dtype=torch.bool, device=device)
        kv_pos = torch.arange(max_kv, device=device)
        for j, (q_start, q_len, page_ids, kv_len) in enumerate(reqs):
            rows[j, :q_len] = torch.arange(q_start, q_start + q_len, device=device)
            row_mask[j, :q_len] = True
            pos = torch.arange(kv_len, device=device)
            kv_page[j, :kv_len] = page_ids[pos // page_size]
            kv_offset[j, :kv_len] = pos % page_size
            # query i sits at position kv_len - q_len + i and sees every key up to itself
            q_pos = torch.arange(kv_len - q_len, kv_len, device=device)
            attn_mask[j, 0, :q_len] = kv_pos[None, :] <= q_pos[:, None]
        all_rows = bool(row_mask.all())
        return _Group(rows, None if all_rows else row_mask, kv_page, kv_offset, attn_mask)

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, out: torch.Tensor, sm_scale: float
    ) -> torch.Tensor:
        """Attention of every group; keys/values are token-major caches [pages, page_size, H, D]."""
        for g in self._groups:
            qg = q[g.rows].transpose(1, 2)  # [B, Hq, max_q, D]
            kg = keys[g.kv_page, g.kv_offset].transpose(1, 2).to(q.dtype)  # [B, Hkv, max_kv, D]
            vg = values[g.kv_page, g.kv_offset].transpose(1, 2).to(q.dtype)
            og = F.scaled_dot_product_attention(
                qg, kg, vg, attn_mask=g.attn_mask, scale=sm_scale, enable_gqa=kg.shape[1] != qg.shape[1]
            ).transpose(1, 2)  # [B, max_q, Hq, Dv]
            if g.row_mask is None:
                out[g.rows.reshape(-1)] = og.reshape(-1, *og.shape[2:])
            else:
                out[g.rows[g.row_mask]] = og[g.row_mask]
        return out

    def run(
        self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float
    ) -> torch.Tensor:
        """GQA attention of one layer (see `AttentionBackend.run`).

        Args:
            q: [num_tokens, num_q_heads_local, head_dim]
            k: [num_tokens, num_kv_heads_local, head_dim], new tokens
            v: [num_tokens, num_kv_heads_local, head_dim], new tokens
            sm_scale: softmax scale
        Returns:
            [num_tokens, num_q_heads_local, head_dim]
        """
        assert q.shape[0] == self._num_tokens, "run() called with a batch other than the planned one"
        k_cache, v_cache = self.kv_cache.k_v_token_major(layer_id)
        k_cache[self._new_page, self._new_offset] = k.to(k_cache.dtype)
        v_cache[self._new_page, self._new_offset] = v.to(v_cache.dtype)
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
        return self._attend(q, k_cache, v_cache, out, sm_scale)

    def run_mla(
        self,
        layer_id: int,
        q_latent: torch.Tensor,
        q_rope: torch.Tensor,
        kv_latent: torch.Tensor,
        k_rope: torch.Tensor,
        sm_scale: float,
    ) -> torch.Tensor:
        """MLA attention of one layer in absorbed form (see `AttentionBackend.run_mla`).

        Args:
            q_latent: [num_tokens, num_heads_local, kv_lora_rank]
            q_rope: [num_tokens, num_heads_local, qk_rope_head_dim]
            kv_latent: [num_tokens, kv_lora_rank], new tokens
            k_rope: [num_tokens, qk_rope_head_dim], new tokens
            sm_scale: softmax scale of the un-absorbed head dim
        Returns:
            [num_tokens, num_heads_local, kv_lora_rank]
        """
        assert q_latent.shape[0] == self._num_tokens, "run_mla() called with an unplanned batch"
        cache = self.kv_cache.latent(layer_id)  # [num_pages, page_size, latent_dim]
        rank = kv_latent.shape[1]
        cache[self._new_page, self._new_offset] = torch.cat([kv_latent, k_rope], dim=-1).to(cache.dtype)
        # one shared "head": scores against [latent | rope], values are the latent part
        keys = cache.unsqueeze(2)  # [num_pages, page_size, 1, latent_dim]
        values = cache[..., :rank].unsqueeze(2)
        q = torch.cat([q_latent, q_rope], dim=-1)
        out = torch.empty(q.shape[0], q.shape[1], rank, dtype=q.dtype, device=q.device)
        return self._attend(q, keys, values, out, sm_scale)
