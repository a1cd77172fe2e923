"""The reference paged attention backend in plain torch: any device, HND / NHD, GQA and MLA.

It is the oracle the FlashInfer backend and the models are checked against, and the CPU engine's
backend. `plan` turns the step's FlashInfer-style metadata into gather indices and masks once;
`run` stores the new tokens' KV in the pages and attends with `scaled_dot_product_attention`:
one-token (decode) requests in padded calls of about a cache's worth of gathered KV each,
prefill chunks grouped by length (a padded call for mixed lengths would waste memory on
[batch, max_q, max_kv] masks), chunks with no earlier KV by SDPA's causal fast path (no mask).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from disaggsdk.engine.kv_scales import from_cache, to_cache

if TYPE_CHECKING:
    from disaggsdk.engine.forward_batch import ForwardBatch
    from disaggsdk.engine.kv_cache import KVCache

# Gathered K and V per layer of one decode call. Each call costs fixed Python and dispatch time
# (indexing, two gathers, attention, the scatter back), so fewer, larger calls win until the gathered
# copy no longer fits the caches. Measured on the 2-core dev box (2 MiB L2, 32 MiB L3), ~1,100-token
# contexts, min of 6 x 15 steps: batch 8 12.5 ms a step at 1 MiB (one request per call), 10.1 at 4
# MiB, 10.2 at 16 MiB; batch 24 22.6, 21.6, 19.4 (noisy: medians 27.5, 25.7, 25.1).
GATHER_BUDGET_BYTES = 1 << 22
# A chunk this short over earlier KV (a speculative step's last token and its drafts) is attended
# as that many one-query decodes, query j over the first kv_len - q_len + 1 + j tokens: the
# decode path (and the CPU backend's paged kernel) instead of a gathered, masked SDPA call.
SHORT_CHUNK_TOKENS = 8

# One request's queries of a step: (first query row, number of queries, its page ids, KV length).
_Queries = tuple[int, int, list[int], int]


@dataclass
class _Group:
    """Requests attended in one SDPA call. KV is gathered a whole page at a time (one index per
    page, not per token) and the padding past each request's length is masked out.

    A *fresh* group is prefill chunks of one length that start at position 0 (no earlier KV):
    their keys are exactly this step's new tokens, so attention is plain causal attention over
    them, with SDPA's causal fast path (no gather, no [q, kv] mask: 2.5x faster for a 1,023-token
    prompt, 8 query and 2 kv heads of 32, than the masked call over gathered pages).
    """

    rows: torch.Tensor  # [B, max_q], int64, token rows of each request's queries (padded with 0)
    row_mask: torch.Tensor | None  # [B, max_q], bool, real query rows; None when none are padding
    page_table: torch.Tensor | None  # [B, max_pages], int64, each request's pages (padded with page 0)
    attn_mask: torch.Tensor | None  # [B, 1, max_q, max_pages * page_size], bool, True where q may attend
    fresh: bool = False  # causal over the new tokens alone (page_table and attn_mask are None)
    spans: tuple[tuple[int, int, int], ...] = ()  # (first query row, queries, KV length) per request


def _decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      sm_scale: float) -> torch.Tensor:
    """One query per request, with grouped heads folded into the matmul (no K/V repeat).

    Args:
        q: [B, Hq, 1, D]; k: [B, Hkv, L, D]; v: [B, Hkv, L, Dv]; mask: [B, 1, 1, L], bool.
    Returns:
        [B, Hq, 1, Dv]
    """
    b, hq, _, d = q.shape
    hkv = k.shape[1]
    # q head h reads kv head h // (hq // hkv): the query heads of one kv head are adjacent
    scores = torch.matmul(q.reshape(b, hkv, hq // hkv, d), k.transpose(-1, -2)) * sm_scale
    scores = scores.masked_fill(~mask.view(b, 1, 1, -1), float("-inf"))
    out = torch.matmul(scores.softmax(-1), v)  # [B, Hkv, Hq / Hkv, Dv]
    return out.reshape(b, hq, 1, v.shape[-1])


class TorchRefBackend:
    """Paged attention over one rank's `KVCache` in plain torch.

    Args:
        kv_cache: the rank's cache; `run` writes into it.
    """

    def __init__(self, kv_cache: KVCache, gather_budget_bytes: int = GATHER_BUDGET_BYTES):
        self.kv_cache = kv_cache
        self.gather_budget_bytes = gather_budget_bytes
        self._groups: list[_Group] = []
        self._new_page: torch.Tensor | None = None  # [num_tokens], int64
        self._new_offset: torch.Tensor | None = None  # [num_tokens], int64
        self._num_tokens = 0

    def plan(self, batch: ForwardBatch) -> None:
        """Build page tables and causal masks for every layer of this step."""
        device = self.kv_cache.buffer.device
        page_size = batch.page_size
        self._plan_new_tokens(batch)
        qo = batch.qo_indptr.tolist()
        kv_indptr = batch.kv_page_indptr.tolist()
        last_len = batch.kv_last_page_len.tolist()
        pages = batch.kv_page_indices.tolist()
        decode: list[_Queries] = []
        prefill: list[_Queries] = []
        for i in range(batch.batch_size):
            num_pages = kv_indptr[i + 1] - kv_indptr[i]
            kv_len = (num_pages - 1) * page_size + last_len[i] if num_pages else 0
            q_len = qo[i + 1] - qo[i]
            assert 0 < q_len <= kv_len, f"request {i}: {q_len} new tokens but KV length {kv_len}"
            req_pages = pages[kv_indptr[i] : kv_indptr[i + 1]]
            if q_len == 1 or (q_len <= SHORT_CHUNK_TOKENS and q_len < kv_len):
                decode.extend((qo[i] + j, 1, req_pages, kv_len - q_len + 1 + j) for j in range(q_len))
            else:
                prefill.append((qo[i], q_len, req_pages, kv_len))
        # decodes in calls whose gathered KV stays in cache; prefill chunks of equal length
        # together (no padding wasted), fresh ones (no earlier KV) apart
        by_len: dict[tuple[int, bool], list[_Queries]] = {}
        for req in prefill:
            by_len.setdefault((req[1], req[1] == req[3]), []).append(req)
        self._groups = self._plan_decodes(decode, page_size, device)
        self._groups += [self._fresh_group(reqs, device) if fresh else self._group(reqs, page_size, device)
                         for (_, fresh), reqs in by_len.items()]

    def _plan_new_tokens(self, batch: ForwardBatch) -> None:
        """Where `run` stores this step's new K/V: page and offset of each new token."""
        slots = batch.kv_slot_ids.to(device=self.kv_cache.buffer.device, dtype=torch.int64)
        self._new_page = slots // batch.page_size
        self._new_offset = slots % batch.page_size
        self._num_tokens = batch.num_tokens

    def _plan_decodes(self, decode: list[_Queries], page_size: int, device: torch.device) -> list[_Group]:
        """The groups of the one-token requests ``decode`` ((q_start, 1, page ids, kv_len) each)."""
        return [self._group(reqs, page_size, device) for reqs in self._decode_calls(decode)]

    def _decode_calls(self, decode: list[_Queries]) -> list[list[_Queries]]:
        """Decode requests split into calls of at most `gather_budget_bytes` of gathered KV per layer.

        One call for every decode would gather more KV than the CPU caches hold, and attention
        would then read it back from memory: a step at batch 16 of 1,152-token contexts cost 4x
        one at batch 8. The budget is for CPUs; FlashInfer never gathers.
        """
        page_bytes = self.kv_cache.pool.fmt.page_bytes
        calls: list[list[_Queries]] = []
        call_bytes = 0
        for req in decode:
            req_bytes = len(req[2]) * page_bytes
            if not calls or call_bytes + req_bytes > self.gather_budget_bytes:
                calls.append([])
                call_bytes = 0
            calls[-1].append(req)
            call_bytes += req_bytes
        return calls

    @staticmethod
    def _group(reqs: list[_Queries], page_size: int, device: torch.device) -> _Group:
        max_q = max(r[1] for r in reqs)
        max_pages = max(len(r[2]) for r in reqs)
        rows, row_mask, page_table, kv_lens, q_lens = [], [], [], [], []
        for q_start, q_len, page_ids, kv_len in reqs:
            rows.append(list(range(q_start, q_start + q_len)) + [0] * (max_q - q_len))
            row_mask.append([True] * q_len + [False] * (max_q - q_len))
            page_table.append(page_ids + [0] * (max_pages - len(page_ids)))
            kv_lens.append(kv_len)
            q_lens.append(q_len)
        kv_len_t = torch.tensor(kv_lens, device=device)[:, None, None]  # [B, 1, 1]
        # query i of a request sits at position kv_len - q_len + i and sees every key up to itself
        q_pos = kv_len_t - torch.tensor(q_lens, device=device)[:, None, None] + torch.arange(max_q, device=device)[None, :, None]
        kv_pos = torch.arange(max_pages * page_size, device=device)[None, None, :]
        attn_mask = ((kv_pos <= q_pos) & (kv_pos < kv_len_t)).unsqueeze(1)
        rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
        row_mask_t = torch.tensor(row_mask, dtype=torch.bool, device=device)
        page_t = torch.tensor(page_table, dtype=torch.int64, device=device)
        spans = tuple((q_start, q_len, kv_len) for q_start, q_len, _, kv_len in reqs)
        return _Group(rows_t, None if all(map(all, row_mask)) else row_mask_t, page_t, attn_mask, spans=spans)

    @staticmethod
    def _fresh_group(reqs: list[_Queries], device: torch.device) -> _Group:
        rows = torch.tensor([list(range(q_start, q_start + q_len)) for q_start, q_len, _, _ in reqs],
                            dtype=torch.int64, device=device)
        return _Group(rows, None, None, None, fresh=True)

    def _gather(self, cache: torch.Tensor, page_table: torch.Tensor, token_major: bool) -> torch.Tensor:
        """[B, H, max_pages * page_size, D] from pages stored [pages, H, P, D] or, token_major, [pages, P, H, D].

        One copy, by `index_select` of whole contiguous blocks (a page, or one head of a page),
        which runs at memcpy speed where advanced indexing of a strided view is several times
        slower and dominated a CPU decode step. The order of the index puts the blocks where a plain
        reshape (a view) merges them with the token dim.
        """
        b, n = page_table.shape
        if token_major:  # [B * n, P, H, D] -> [B, n * P, H, D] (view) -> [B, H, n * P, D] (view)
            g = cache.index_select(0, page_table.reshape(-1))
            return g.view(b, n * g.shape[1], g.shape[2], g.shape[3]).transpose(1, 2)
        num_pages, h, p, d = cache.shape
        # block (page, head) sits at page * H + head of the [pages * H, P, D] view; index order B, H, n
        blocks = page_table[:, None, :] * h + torch.arange(h, device=page_table.device)[None, :, None]
        # a view, never a copy: the stored layout keeps each page's heads at one stride
        g = cache.view(num_pages * h, p, d).index_select(0, blocks.reshape(-1))
        return g.view(b, h, n * p, d)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, token_major: bool, out: torch.Tensor,
                sm_scale: float, new_keys: torch.Tensor, new_values: torch.Tensor,
                kv_scales: tuple[float, float]) -> torch.Tensor:
        """Attention of every group over paged keys/values (layout given by ``token_major``; stored
        values times ``kv_scales`` (k, v) for an fp8 cache); fresh groups over ``new_keys``/``new_values``
        ([num_tokens, Hkv, D], already as the cache rounds them) instead."""
        k_scale, v_scale = kv_scales
        for g in self._groups:
            if g.fresh:
                self._attend_fresh(g, q, new_keys, new_values, sm_scale, out)
                continue
            if g.rows.shape[1] > 1 and self._attend_chunks(g, q, keys, values, token_major, out, sm_scale, kv_scales):
                continue  # no masked SDPA call for these chunks
            assert g.page_table is not None and g.attn_mask is not None, "a group that is not fresh is paged"
            qg = q[g.rows].transpose(1, 2)  # [B, Hq, max_q, D]
            kg = from_cache(self._gather(keys, g.page_table, token_major), q.dtype, k_scale)  # [B, Hkv, L, D]
            vg = from_cache(self._gather(values, g.page_table, token_major), q.dtype, v_scale)
            if qg.shape[2] == 1:
                # decode: grouped heads folded into one matmul; SDPA's flash kernel measured 1.4x
                # slower for one query (and for MLA would repeat the one latent "head" per query head)
                og = _decode_attention(qg, kg, vg, g.attn_mask, sm_scale).transpose(1, 2)
            else:
                og = F.scaled_dot_product_attention(
                    qg, kg, vg, attn_mask=g.attn_mask, scale=sm_scale, enable_gqa=kg.shape[1] != qg.shape[1]
                ).transpose(1, 2)  # [B, max_q, Hq, Dv]
            if g.row_mask is None:
                out[g.rows.reshape(-1)] = og.reshape(-1, *og.shape[2:])
            else:
                out[g.rows[g.row_mask]] = og[g.row_mask]
        return out

    def _attend_chunks(self, g: _Group, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                       token_major: bool, out: torch.Tensor, sm_scale: float, kv_scales: tuple[float, float]) -> bool:
        """Chunks over earlier KV by a path faster than masked SDPA, into ``out`` (CpuBackend: its kernel)."""
        return False

    def _attend_fresh(self, g: _Group, q: torch.Tensor, new_keys: torch.Tensor, new_values: torch.Tensor,
                      sm_scale: float, out: torch.Tensor) -> None:
        """Causal attention of a fresh group's prompts over their own new tokens, into ``out``."""
        qg = q[g.rows].transpose(1, 2)  # [B, Hq, L, D]
        out[g.rows.reshape(-1)] = self._causal(qg, new_keys[g.rows], new_values[g.rows], sm_scale)

    @staticmethod
    def _causal(qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """Causal attention of [B, Hq, L, D] queries over [B, L, Hkv, D] keys/values of the same
        tokens; returns [B * L, Hq, Dv]. Grouped kv heads are repeated (a copy of the new tokens'
        K and V only): SDPA's CPU flash kernel with ``enable_gqa`` measured 1.6x slower."""
        hq, hkv = qg.shape[1], k.shape[2]
        kg, vg = k.transpose(1, 2), v.transpose(1, 2)
        if hkv != hq:
            kg, vg = kg.repeat_interleave(hq // hkv, dim=1), vg.repeat_interleave(hq // hkv, dim=1)
        og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True, scale=sm_scale)
        return og.transpose(1, 2).reshape(-1, hq, v.shape[-1])

    def run(self, layer_id: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """GQA attention of one layer (see `AttentionBackend.run`): q [num_tokens, q heads, head_dim],
        the new tokens' k and v [num_tokens, kv heads, head_dim]; returns [num_tokens, q heads, head_dim]."""
        assert q.shape[0] == self._num_tokens, "run() called with a batch other than the planned one"
        kv_scales = self._kv_scales(layer_id)
        k_stored, v_stored = self._store_kv(layer_id, k, v)
        k_cache, v_cache = self.kv_cache.k_v(layer_id)  # the stored layout: gather whole pages
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype, device=q.device)
        # fresh prefill reads the new K/V as stored (rounded to the cache dtype), as decode will
        new_k, new_v = from_cache(k_stored, q.dtype, kv_scales[0]), from_cache(v_stored, q.dtype, kv_scales[1])
        return self._attend(q, k_cache, v_cache, self.kv_cache.layout == "NHD", out, sm_scale, new_k, new_v,
                            kv_scales)

    def _kv_scales(self, layer_id: int) -> tuple[float, float]:
        """(k_scale, v_scale) of the layer: what an fp8 cache's stored values are multiplied by."""
        return self.kv_cache.k_scale(layer_id), self.kv_cache.v_scale(layer_id)

    def _store_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the step's new K and V ([num_tokens, Hkv, D]) in the layer's pages.

        Returns:
            The new K and V as stored ([num_tokens, Hkv, D], the cache's dtype).
        """
        k_tm, v_tm = self.kv_cache.k_v_token_major(layer_id)
        k_stored = to_cache(k, k_tm.dtype, self.kv_cache.k_scale(layer_id))
        v_stored = to_cache(v, v_tm.dtype, self.kv_cache.v_scale(layer_id))
        k_tm[self._new_page, self._new_offset] = k_stored
        v_tm[self._new_page, self._new_offset] = v_stored
        return k_stored, v_stored

    def run_mla(self, layer_id: int, q_latent: torch.Tensor, q_rope: torch.Tensor, kv_latent: torch.Tensor,
                k_rope: torch.Tensor, sm_scale: float) -> torch.Tensor:
        """MLA attention of one layer in absorbed form: `AttentionBackend.run_mla` says the shapes."""
        assert q_latent.shape[0] == self._num_tokens, "run_mla() called with an unplanned batch"
        cache = self.kv_cache.latent(layer_id)  # [num_pages, page_size, latent_dim]
        rank = kv_latent.shape[1]
        scale = self.kv_cache.k_scale(layer_id)  # one scale: the values are the keys' first columns
        stored = to_cache(torch.cat([kv_latent, k_rope], dim=-1), cache.dtype, scale)
        cache[self._new_page, self._new_offset] = stored
        # one shared "head": scores against [latent | rope], values are the latent part
        keys = cache.unsqueeze(2)  # [num_pages, page_size, 1, latent_dim]
        values = cache[..., :rank].unsqueeze(2)
        q = torch.cat([q_latent, q_rope], dim=-1)
        out = torch.empty(q.shape[0], q.shape[1], rank, dtype=q.dtype, device=q.device)
        new_keys = from_cache(stored, q.dtype, scale).unsqueeze(1)
        return self._attend(q, keys, values, True, out, sm_scale, new_keys, new_keys[..., :rank], (scale, scale))
