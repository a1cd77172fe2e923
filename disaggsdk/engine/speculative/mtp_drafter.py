"""Drafting with DeepSeek's MTP layer, run after every target step.

The layer sees, for each position i the target just computed, the target's hidden state h_i and
the token t_{i+1} after it, and its attention keeps its own KV (cache layer ``num_layers``, the
same pages and slots as the target's). So after each step it runs over every row of the step's
batch with the step's attention plan -- prefill chunks included, so the prompt's MTP KV exists
when decoding starts -- with t_{i+1} read from the request's tokens as they stand after the step
(the token just chosen included; rows past a request's new end, rejected drafts, get a pad and
their KV is overwritten later). The row of each request's last valid position gives its first
draft; further drafts chain the layer on its own output, one position at a time (as vLLM runs a
one-layer MTP for k > 1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch
from disaggsdk.engine.forward_batch import ForwardBatch
from disaggsdk.engine.sequence import Request
from disaggsdk.memory.page_allocator import PageAllocator

PAD_TOKEN_ID = 0


@dataclass(frozen=True)
class DraftSlot:
    """A request that drafts after this step: its row in the step's batch and how many drafts."""

    request: Request
    row: int  # row of the batch whose MTP output gives the first draft (its last valid position)
    num_drafts: int


def next_token_ids(requests: Sequence[Request], starts: Sequence[int], lengths: Sequence[int]) -> list[int]:
    """t_{i+1} for every row of a batch: chunk c covers positions starts[c] .. + lengths[c]."""
    ids: list[int] = []
    for req, start, n in zip(requests, starts, lengths):
        tokens = req.all_ids
        stop = min(start + n + 1, len(tokens))
        ids.extend(tokens[start + 1 : stop])
        ids.extend([PAD_TOKEN_ID] * (start + n + 1 - max(stop, start + 1)))
    return ids


class MTPDrafter:
    """Runs ``model.mtp[0]`` over each step and proposes drafts.

    Args:
        model: the target model (its ``mtp`` layer is used).
        attn: the attention backend the target's step was planned on.
        allocator: the engine's page allocator (chained drafts need pages for their positions).
        page_size: tokens per page.
        device: where batches go.
    """

    def __init__(self, model: torch.nn.Module, attn: object, allocator: PageAllocator, page_size: int,
                 device: torch.device):
        self.mtp = model.mtp[0]
        self.mtp.share_with(model)
        self.attn = attn
        self.allocator = allocator
        self.page_size = page_size
        self.device = device

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, hidden_all: torch.Tensor, next_ids: list[int],
            slots: Sequence[DraftSlot], on_layer_done: Callable[[int, torch.Tensor], None] | None = None,
            ) -> dict[str, list[int]]:
        """Fill the MTP KV of every row of ``batch`` (still planned) and draft for ``slots``;
        ``on_layer_done`` is told when that KV is written (the layer counter of a prefill unit).

        Returns:
            request id -> its drafts (1 .. num_drafts tokens; fewer when pages ran out).
        """
        ids = torch.tensor(next_ids, dtype=torch.int64, device=self.device)
        hidden = self.mtp(hidden_all, ids, batch.positions, self.attn, on_layer_done)
        if not slots:
            return {}
        h = hidden[torch.tensor([s.row for s in slots], device=self.device)]
        drafts = {s.request.request_id: [t] for s, t in zip(slots, self._argmax(h))}
        live = list(range(len(slots)))  # slots still drafting, in the order of h's rows
        for c in range(1, max(s.num_drafts for s in slots)):
            keep = [j for j, i in enumerate(live) if slots[i].num_drafts > c and self._cover(slots[i].request, c)]
            if not keep:
                break
            live = [live[j] for j in keep]
            # draft c + 1 of a request: the layer at the position of draft c's predecessor, fed draft c
            items = [BatchItem([drafts[slots[i].request.request_id][-1]], slots[i].request.num_computed_tokens + c - 1,
                               self.allocator.page_ids(slots[i].request.request_id)) for i in live]
            chain = build_forward_batch(items, self.page_size, self.device)
            self.attn.plan(chain)
            h = self.mtp(h[torch.tensor(keep, device=self.device)], chain.input_ids, chain.positions, self.attn)
            for i, t in zip(live, self._argmax(h)):
                drafts[slots[i].request.request_id].append(t)
        return drafts

    def _argmax(self, hidden: torch.Tensor) -> list[int]:
        return self.mtp.compute_logits(hidden).argmax(dim=-1).tolist()

    def _cover(self, req: Request, c: int) -> bool:
        """Pages for the chain position of draft c + 1 (the next step needs them anyway)."""
        needed = -(-(req.num_computed_tokens + c) // self.page_size) - len(self.allocator.page_ids(req.request_id))
        if needed <= 0:
            return True
        if not self.allocator.can_allocate(needed):
            return False
        self.allocator.allocate(req.request_id, needed)
        return True
