"""The oracle of dispatch / combine: every rank of a group simulated in one process with plain torch.

A collective cannot be called rank by rank from one thread (rank 0's dispatch needs rank 1's
tokens before it returns), so the reference takes all ranks' inputs at once and returns all
ranks' results: `dispatch_all` / `combine_all` are the `ExpertDispatcher` calls of every rank
together. It is written as loops over ranks, tokens and slots, as the contract in `base` states
it, and shares nothing with `all_to_all` but the final `weighted_sum`; it also says what each
rank's exchange must count, so the measured `AllToAllCounters` have an oracle too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from disaggsdk.engine.expert_parallel.base import AllToAllCounters, DispatchedTokens, DispatchHandle, weighted_sum
from disaggsdk.engine.expert_parallel.expert_map import ExpertMap

# per rank and dispatch: the split counts sent to each other rank (int64), then per row its local
# expert id (int64); combine sends no metadata. AllToAllDispatcher makes the same calls.
COUNT_BYTES = 8
EXPERT_ID_BYTES = 8
DISPATCH_CALLS = 3  # counts, rows, expert ids
COMBINE_CALLS = 1


class ReferenceDispatch:
    """All ranks of an expert-parallel group in one process.

    Args:
        expert_map: where the experts live; ``expert_map.ep_size`` is the number of simulated ranks.
    """

    def __init__(self, expert_map: ExpertMap):
        self.expert_map = expert_map
        self.counters = [AllToAllCounters() for _ in range(expert_map.ep_size)]  # per simulated rank

    def dispatch_all(self, hidden: Sequence[torch.Tensor], topk_ids: Sequence[torch.Tensor],
                     topk_weights: Sequence[torch.Tensor]) -> list[DispatchedTokens]:
        """Every rank's `ExpertDispatcher.dispatch` at once.

        Args:
            hidden: per rank, [num_tokens_r, hidden_size].
            topk_ids: per rank, [num_tokens_r, top_k] int64 global expert ids.
            topk_weights: per rank, [num_tokens_r, top_k] float32.
        Returns:
            Per rank, the rows it receives (source rank, then token, then slot ascending).
        """
        ep = self.expert_map.ep_size
        assert len(hidden) == len(topk_ids) == len(topk_weights) == ep, "one input per rank"
        # sent[src][dst]: pair indices (token * k + slot) that src sends to dst, in pair order
        sent: list[list[list[int]]] = [[[] for _ in range(ep)] for _ in range(ep)]
        for src in range(ep):
            top_k = topk_ids[src].shape[1]
            for token, ids in enumerate(topk_ids[src].tolist()):
                for slot, expert in enumerate(ids):
                    sent[src][self.expert_map.rank_of(expert)].append(token * top_k + slot)
        out = []
        for dst in range(ep):
            rows: list[torch.Tensor] = []
            local_ids: list[int] = []
            for src in range(ep):
                top_k = topk_ids[src].shape[1]
                for pair in sent[src][dst]:
                    rows.append(hidden[src][pair // top_k])
                    local_ids.append(self.expert_map.locate(int(topk_ids[src][pair // top_k, pair % top_k]))[1])
            hidden_size, dtype = hidden[dst].shape[1], hidden[dst].dtype
            received = torch.stack(rows) if rows else torch.empty(0, hidden_size, dtype=dtype)
            top_k = topk_ids[dst].shape[1]
            handle = DispatchHandle(
                num_tokens=hidden[dst].shape[0], top_k=top_k,
                send_order=torch.tensor([p for d in range(ep) for p in sent[dst][d]], dtype=torch.int64),
                topk_weights=topk_weights[dst],
                send_splits=tuple(len(sent[dst][d]) for d in range(ep)),
                recv_splits=tuple(len(sent[s][dst]) for s in range(ep)),
            )
            out.append(DispatchedTokens(received, torch.tensor(local_ids, dtype=torch.int64), handle))
        for rank, tokens in enumerate(out):
            self._count_dispatch(rank, tokens.handle, hidden[rank].shape[1] * hidden[rank].element_size())
        return out

    def combine_all(self, expert_out: Sequence[torch.Tensor], handles: Sequence[DispatchHandle]) -> list[torch.Tensor]:
        """Every rank's `ExpertDispatcher.combine` at once.

        Args:
            expert_out: per rank, [num_recv_rows_r, hidden_size], its experts' unweighted outputs.
            handles: per rank, the handle of its `dispatch_all` result.
        Returns:
            Per rank, [num_tokens_r, hidden_size].
        """
        ep = self.expert_map.ep_size
        # back[src][dst]: the outputs dst computed for src's pairs, in the order src sent them
        back: list[list[torch.Tensor]] = [[] for _ in range(ep)]
        for dst in range(ep):
            start = 0
            for src in range(ep):
                n = handles[src].send_splits[dst]
                back[src].append(expert_out[dst][start:start + n])
                start += n
        out = []
        for rank, handle in enumerate(handles):
            hidden_size, dtype = expert_out[rank].shape[1], expert_out[rank].dtype
            pair_rows = torch.empty(handle.num_tokens * handle.top_k, hidden_size, dtype=dtype)
            returned = torch.cat(back[rank]) if back[rank] else pair_rows[:0]
            for row, pair in enumerate(handle.send_order.tolist()):
                pair_rows[pair] = returned[row]
            out.append(weighted_sum(pair_rows, handle.topk_weights))
            counters = self.counters[rank]
            counters.num_combines += 1
            counters.num_all_to_all_calls += COMBINE_CALLS
            row_bytes = hidden_size * expert_out[rank].element_size()
            remote_rows = sum(handle.recv_splits) - handle.recv_splits[rank]
            counters.combine_payload_bytes += remote_rows * row_bytes
            counters.local_bytes += handle.recv_splits[rank] * row_bytes
        return out

    def _count_dispatch(self, rank: int, handle: DispatchHandle, row_bytes: int) -> None:
        counters = self.counters[rank]
        ep = self.expert_map.ep_size
        remote_rows = sum(handle.send_splits) - handle.send_splits[rank]
        counters.num_dispatches += 1
        counters.num_all_to_all_calls += DISPATCH_CALLS
        counters.dispatch_payload_bytes += remote_rows * row_bytes
        counters.metadata_bytes += (ep - 1) * COUNT_BYTES + remote_rows * EXPERT_ID_BYTES
        counters.local_bytes += handle.send_splits[rank] * row_bytes
        counters.rows_sent += sum(handle.send_splits)
        counters.rows_received += sum(handle.recv_splits)
