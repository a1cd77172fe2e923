"""Turn the scheduled chunks of one step into a `ForwardBatch` (flattened tokens + page metadata)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from disaggsdk.engine.forward_batch import ForwardBatch


@dataclass(frozen=True)
class BatchItem:
    """One request's part of a step: ``token_ids`` at positions ``start_pos ..`` in its sequence.

    ``page_ids`` are the request's pages in order and must cover ``start_pos + len(token_ids)``
    tokens; ``want_logits`` asks for the logits of the last ``num_logits`` tokens (a token will be
    sampled; several when speculative drafts are verified).
    """

    token_ids: Sequence[int]
    start_pos: int
    page_ids: Sequence[int]
    want_logits: bool = True
    num_logits: int = 1


def build_forward_batch(items: Sequence[BatchItem], page_size: int, device: str | torch.device = "cpu",
                        on_layer_done: Callable[[int, torch.Tensor], None] | None = None) -> ForwardBatch:
    """Flatten ``items`` into a `ForwardBatch`.

    Args:
        items: the step's chunks, in batch order.
        page_size: tokens per KV page.
        device: where the tensors go.
        on_layer_done: the layer-counter callback for the head rank, or None.
    Returns:
        The batch; ``logits_indices`` lists the last ``num_logits`` rows of each item with ``want_logits``.
    """
    input_ids: list[int] = []
    positions: list[int] = []
    qo_indptr = [0]
    kv_page_indptr = [0]
    kv_page_indices: list[int] = []
    kv_last_page_len: list[int] = []
    kv_slot_ids: list[int] = []
    logits_indices: list[int] = []
    for item in items:
        n = len(item.token_ids)
        kv_len = item.start_pos + n
        num_pages = -(-kv_len // page_size)
        assert n > 0 and len(item.page_ids) >= num_pages, "a chunk needs tokens and pages for them"
        pages = list(item.page_ids[:num_pages])
        input_ids.extend(item.token_ids)
        pos = range(item.start_pos, kv_len)
        positions.extend(pos)
        kv_slot_ids.extend(pages[p // page_size] * page_size + p % page_size for p in pos)
        qo_indptr.append(qo_indptr[-1] + n)
        kv_page_indices.extend(pages)
        kv_page_indptr.append(len(kv_page_indices))
        kv_last_page_len.append(kv_len - (num_pages - 1) * page_size)
        if item.want_logits:
            logits_indices.extend(range(qo_indptr[-1] - item.num_logits, qo_indptr[-1]))

    def t(values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    return ForwardBatch(
        input_ids=t(input_ids, torch.int64),
        positions=t(positions, torch.int64),
        qo_indptr=t(qo_indptr, torch.int32),
        kv_page_indptr=t(kv_page_indptr, torch.int32),
        kv_page_indices=t(kv_page_indices, torch.int32),
        kv_last_page_len=t(kv_last_page_len, torch.int32),
        kv_slot_ids=t(kv_slot_ids, torch.int64),
        logits_indices=t(logits_indices, torch.int64),
        page_size=page_size,
        on_layer_done=on_layer_done,
    )
