"""Test-only helpers for the model tests: a contiguous-cache attention oracle and batch building
(the transformers checkpoints they are checked against come from tests/hf_checkpoints.py).

`ContiguousAttention` implements the AttentionBackend contract without pages: it keeps each
request's K/V (or MLA latent) in a plain per-request list, keyed by the request's index in the
batch, so a test that keeps the batch composition fixed can run prefill and then decode steps.
It is the model tests' oracle until (and independently of) the runtime's paged backends.
"""

from __future__ import annotations

import torch

from disaggsdk.engine.forward_batch import ForwardBatch


class ContiguousAttention:
    """Causal attention over each request's cached tokens plus its new ones (no pages)."""

    def __init__(self) -> None:
        self.cache: dict[tuple[int, int], list[torch.Tensor]] = {}  # (layer, request) -> tensors
        self.qo_indptr: list[int] = []

    def plan(self, batch: ForwardBatch) -> None:
        self.qo_indptr = batch.qo_indptr.tolist()

    def _append(self, layer_id: int, i: int, *new: torch.Tensor) -> list[torch.Tensor]:
        old = self.cache.get((layer_id, i))
        full = list(new) if old is None else [torch.cat([o, n]) for o, n in zip(old, new)]
        self.cache[(layer_id, i)] = full
        return full

    @staticmethod
    def _causal_softmax(scores: torch.Tensor) -> torch.Tensor:
        # scores: [heads, num_new, kv_len]; the new tokens are the last num_new of the KV
        num_new, kv_len = scores.shape[1], scores.shape[2]
        q_pos = torch.arange(kv_len - num_new, kv_len, device=scores.device)[:, None]
        mask = torch.arange(kv_len, device=scores.device)[None, :] > q_pos
        return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1, dtype=torch.float32)

    def run(self, layer_id, q, k, v, sm_scale):
        out = torch.empty_like(q)
        group = q.shape[1] // k.shape[1]
        for i in range(len(self.qo_indptr) - 1):
            a, b = self.qo_indptr[i], self.qo_indptr[i + 1]
            keys, values = self._append(layer_id, i, k[a:b], v[a:b])
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
            probs = self._causal_softmax(torch.einsum("qhd,khd->hqk", q[a:b], keys) * sm_scale)
            out[a:b] = torch.einsum("hqk,khd->qhd", probs.to(q.dtype), values)
        return out

    def run_mla(self, layer_id, q_latent, q_rope, kv_latent, k_rope, sm_scale):
        out = torch.empty_like(q_latent)
        for i in range(len(self.qo_indptr) - 1):
            a, b = self.qo_indptr[i], self.qo_indptr[i + 1]
            latent, rope = self._append(layer_id, i, kv_latent[a:b], k_rope[a:b])
            scores = torch.einsum("qhc,kc->hqk", q_latent[a:b], latent)
            scores = scores + torch.einsum("qhr,kr->hqk", q_rope[a:b], rope)
            probs = self._causal_softmax(scores * sm_scale)
            out[a:b] = torch.einsum("hqk,kc->qhc", probs.to(q_latent.dtype), latent)
        return out


def make_batch(chunks: list[list[int]], starts: list[int], on_layer_done=None, device="cpu") -> ForwardBatch:
    """A ForwardBatch of several requests' new tokens; request i's first new token is at
    position ``starts[i]``. Page fields are filled with a trivial one-page-per-token layout
    (the oracle does not read them). Logits are wanted for each request's last token."""
    ids = [t for c in chunks for t in c]
    positions = [starts[i] + j for i, c in enumerate(chunks) for j in range(len(c))]
    qo = [0]
    for c in chunks:
        qo.append(qo[-1] + len(c))
    kv_lens = [s + len(c) for s, c in zip(starts, chunks)]
    page_indptr = [0]
    for n in kv_lens:
        page_indptr.append(page_indptr[-1] + n)
    batch = ForwardBatch(
        input_ids=torch.tensor(ids, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        qo_indptr=torch.tensor(qo, dtype=torch.int32),
        kv_page_indptr=torch.tensor(page_indptr, dtype=torch.int32),
        kv_page_indices=torch.arange(page_indptr[-1], dtype=torch.int32),
        kv_last_page_len=torch.ones(len(chunks), dtype=torch.int32),
        kv_slot_ids=torch.zeros(len(ids), dtype=torch.int64),
        logits_indices=torch.tensor([q - 1 for q in qo[1:]], dtype=torch.int64),
        page_size=1,
        on_layer_done=on_layer_done,
    )
    for field in ("input_ids", "positions", "logits_indices"):
        setattr(batch, field, getattr(batch, field).to(device))
    return batch
