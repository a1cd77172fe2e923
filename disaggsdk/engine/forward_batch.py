"""What one engine step feeds the model: tokens of several requests, flattened, plus paged-KV metadata.

Prefill chunks and decode tokens sit side by side (a decode request is a chunk of length 1), so the
same batch serves the prefill-only, decode-only and mixed (colocated) modes. Names follow
FlashInfer's so the GPU backend can take them as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class ForwardBatch:
    """Inputs of one forward pass.

    Request i owns tokens ``input_ids[qo_indptr[i]:qo_indptr[i+1]]`` and pages
    ``kv_page_indices[kv_page_indptr[i]:kv_page_indptr[i+1]]``; after this step its KV length is
    ``(num_pages - 1) * page_size + kv_last_page_len[i]`` and its new tokens are the last ones.
    """

    input_ids: torch.Tensor  # [num_tokens], int64
    positions: torch.Tensor  # [num_tokens], int64, position of each token within its request
    qo_indptr: torch.Tensor  # [batch_size + 1], int32, token offsets of each request
    kv_page_indptr: torch.Tensor  # [batch_size + 1], int32
    kv_page_indices: torch.Tensor  # [kv_page_indptr[-1]], int32, each request's pages in order
    kv_last_page_len: torch.Tensor  # [batch_size], int32, tokens in the last page after this step
    kv_slot_ids: torch.Tensor  # [num_tokens], int64, page_id * page_size + offset of each new token
    logits_indices: torch.Tensor  # [num_logits], int64, rows of the output whose logits are wanted
    page_size: int
    # Called with the layer index (and that layer's attention output, which a compiled graph's
    # counter op takes so that it runs after it) after the layer's attention output projection and
    # its all-reduce, on the head rank (tp rank 0) only: the messenger streams that layer's pages.
    on_layer_done: Callable[[int, torch.Tensor], None] | None = None

    @property
    def batch_size(self) -> int:
        return int(self.qo_indptr.numel()) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())
