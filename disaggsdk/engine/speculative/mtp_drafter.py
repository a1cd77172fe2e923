"""Drafting with DeepSeek's MTP layer, run after every target step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch
from disaggsdk.engine.forward_batch import ForwardBatch
from disaggsdk.engine.sequence import Request
from disaggsdk.kv.page_allocator import PageAllocator

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import AttentionBackend
    from disaggsdk.engine.compiled_step.torch_compile import CompiledStep
    from disaggsdk.engine.modeling.layers.decoder import DecoderModel

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


class MTPPass:
    """The MTP layer's work on one rank. With tp > 1 the head and every worker make the same calls
    in the same order (the layer's all-reduces keep them in lockstep; the head mirrors each call to
    the workers first). The layer's output rows that draft are kept between calls.

    Args:
        model: this rank's target model (its ``draft_layer()`` is used).
        attn: this rank's attention backend (the target's step is still planned on it).
        device: where the rank's tensors live.
        compiled: the rank's `CompiledStep` when its step is compiled: the layer runs compiled too.
    """

    def __init__(self, model: DecoderModel, attn: AttentionBackend, device: torch.device,
                 compiled: CompiledStep | None = None):
        mtp = model.draft_layer()
        assert mtp is not None, "the engine checks for an MTP layer before drafting with it"
        self.mtp = mtp
        self.mtp.share_with(model)
        self.attn = attn
        self.device = device
        self.compiled = compiled
        self.hidden: torch.Tensor | None = None  # [drafting rows, hidden]: the last call's kept rows

    def _run(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
             draft: bool, on_layer_done: Callable[[int, torch.Tensor], None] | None = None) -> list[int]:
        """The layer over every row; keep the output of ``rows`` (``self.hidden``); with ``draft``
        return their greedy drafts, else []. Compiled, the layer and the argmax are one call
        (`MTPLayer.draft`), made whether or not a row drafts (a step that drafts nothing, a
        prefill, takes its last row's draft and drops it): one family of graphs, not two."""
        drafting = draft and len(rows) > 0
        if self.compiled is not None:
            take = rows if len(rows) else torch.tensor([hidden.shape[0] - 1], dtype=torch.int64, device=self.device)
            kept, ids = self.compiled.mtp_draft(hidden, next_ids, positions, take, on_layer_done)
            self.hidden = kept[: len(rows)]
            return ids.tolist() if drafting else []
        if drafting:
            self.hidden, ids = self.mtp.draft(hidden, next_ids, positions, self.attn, rows, on_layer_done)
            return ids.tolist()
        self.hidden = self.mtp(hidden, next_ids, positions, self.attn, on_layer_done)[rows]  # a tp worker, or no row drafts
        return []

    def fill(self, batch: ForwardBatch, hidden_all: torch.Tensor, next_ids: Sequence[int], rows: Sequence[int],
             on_layer_done: Callable[[int, torch.Tensor], None] | None = None, draft: bool = False) -> list[int]:
        """Run the layer over every row of ``batch`` (still planned; its MTP KV is written), keep ``rows``.

        Returns:
            With ``draft`` (the head rank), the greedy draft of each of ``rows``; else [].
        """
        ids = torch.tensor(next_ids, dtype=torch.int64, device=self.device)
        kept = torch.tensor(rows, dtype=torch.int64, device=self.device)
        return self._run(hidden_all, ids, batch.positions, kept, draft, on_layer_done)

    def chain(self, keep: Sequence[int], chain: ForwardBatch, draft: bool = False) -> list[int]:
        """One more draft: the kept rows ``keep`` fed their last draft (``chain``'s one token each).

        Returns:
            With ``draft`` (the head rank), each row's next greedy draft; else [].
        """
        if chain.num_tokens:  # an empty chain keeps a lock-step dp rank in the MoE exchange (MTPDrafter)
            self.attn.plan(chain)
        assert self.hidden is not None, "chain follows a fill"
        h = self.hidden[torch.tensor(keep, dtype=torch.int64, device=self.device)]
        every_row = torch.arange(len(keep), dtype=torch.int64, device=self.device)
        return self._run(h, chain.input_ids, chain.positions, every_row, draft)


class MTPMirror(Protocol):
    """Sends the head's `MTPPass` calls to the tensor-parallel workers (engine.tp_group.TPGroup)."""

    def mtp_fill(self, next_ids: Sequence[int], rows: Sequence[int]) -> None: ...

    def mtp_chain(self, keep: Sequence[int], chain: ForwardBatch) -> None: ...


class MTPDrafter:
    """Runs the MTP layer over each step and proposes drafts (on the head rank).

    Args:
        model: the target model (its ``draft_layer()`` is used).
        attn: the attention backend the target's step was planned on.
        allocator: the engine's page allocator (chained drafts need pages for their positions).
        page_size: tokens per page.
        device: where batches go.
        mirror: the tp workers, told each call before the head makes it (None at tp 1).
        compiled: the head rank's `CompiledStep` when its step is compiled (tp 1).
        lockstep_chains: in a lock-step dp group (engine.dp_lockstep), the chained calls every step
            makes (num_tokens - 1): the MTP layer is a MoE layer, so every rank makes the same number
            of calls, empty ones where it has fewer drafts to chain; None: as many as needed.
    """

    def __init__(self, model: DecoderModel, attn: AttentionBackend, allocator: PageAllocator, page_size: int,
                 device: torch.device, mirror: MTPMirror | None = None, compiled: CompiledStep | None = None,
                 lockstep_chains: int | None = None):
        self.rank_pass = MTPPass(model, attn, device, compiled)
        self.lockstep_chains = lockstep_chains
        self.mtp = self.rank_pass.mtp
        self.allocator = allocator
        self.page_size = page_size
        self.device = device
        self.mirror = mirror

    @torch.inference_mode()
    def run(self, batch: ForwardBatch, hidden_all: torch.Tensor, next_ids: list[int],
            slots: Sequence[DraftSlot], on_layer_done: Callable[[int, torch.Tensor], None] | None = None,
            ) -> dict[str, list[int]]:
        """Fill the MTP KV of every row of ``batch`` (still planned) and draft for ``slots``;
        ``on_layer_done`` is told when that KV is written (the layer counter of a prefill unit).

        Returns:
            request id -> its drafts (1 .. num_drafts tokens; fewer when pages ran out).
        """
        rows = [s.row for s in slots]
        if self.mirror is not None:
            self.mirror.mtp_fill(next_ids, rows)
        first = self.rank_pass.fill(batch, hidden_all, next_ids, rows, on_layer_done, draft=True)
        drafts = {s.request.request_id: [t] for s, t in zip(slots, first)}
        num_chains = self._chain(slots, drafts) if slots else 0
        for _ in range(num_chains, self.lockstep_chains or 0):
            empty = build_forward_batch([], self.page_size, self.device)
            if self.mirror is not None:
                self.mirror.mtp_chain([], empty)
            self.rank_pass.chain([], empty, draft=True)
        return drafts

    def _chain(self, slots: Sequence[DraftSlot], drafts: dict[str, list[int]]) -> int:
        """Draft 2 .. num_drafts of ``slots`` (their first in ``drafts``). Returns the calls made."""
        num_chains = 0
        live = list(range(len(slots)))  # slots still drafting, in the order of the layer's kept rows
        for c in range(1, max(s.num_drafts for s in slots)):
            keep = [j for j, i in enumerate(live) if slots[i].num_drafts > c and self._cover(slots[i].request, c)]
            if not keep:
                break
            live = [live[j] for j in keep]
            # draft c + 1 of a request: the layer at the position of draft c's predecessor, fed draft c
            items = [BatchItem([drafts[slots[i].request.request_id][-1]], slots[i].request.num_computed_tokens + c - 1,
                               self.allocator.page_ids(slots[i].request.request_id)) for i in live]
            chain = build_forward_batch(items, self.page_size, self.device)
            if self.mirror is not None:
                self.mirror.mtp_chain(keep, chain)
            for i, t in zip(live, self.rank_pass.chain(keep, chain, draft=True)):
                drafts[slots[i].request.request_id].append(t)
            num_chains += 1
        return num_chains

    def _cover(self, req: Request, c: int) -> bool:
        """Pages for the chain position of draft c + 1 (the next step needs them anyway)."""
        needed = -(-(req.num_computed_tokens + c) // self.page_size) - len(self.allocator.page_ids(req.request_id))
        if needed <= 0:
            return True
        if not self.allocator.can_allocate(needed):
            return False
        self.allocator.allocate(req.request_id, needed)
        return True
