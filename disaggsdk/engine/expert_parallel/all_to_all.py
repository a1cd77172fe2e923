"""Dispatch / combine with ``torch.distributed.all_to_all_single`` over the group it is given."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Literal

import torch
import torch.distributed as dist

from disaggsdk.engine.expert_parallel.base import AllToAllCounters, DispatchedTokens, DispatchHandle, weighted_sum

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from disaggsdk.engine.expert_parallel.expert_map import ExpertMap


class AllToAllDispatcher:
    """This rank's `ExpertDispatcher` over a torch.distributed group of ``expert_map.ep_size`` ranks.

    Args:
        expert_map: where the experts live; its ``ep_size`` must be the group's size.
        ep_rank: this process's rank in ``group``.
        group: the expert-parallel process group (gloo or NCCL); None means the default group.
        device: where the tokens live (the routing tables are kept there).
    Raises:
        ValueError: the group's size or this rank does not match ``expert_map``.
    """

    def __init__(self, expert_map: ExpertMap, ep_rank: int, group: ProcessGroup | None = None,
                 device: torch.device | str = "cpu"):
        size = dist.get_world_size(group)
        if size != expert_map.ep_size or dist.get_rank(group) != ep_rank:
            raise ValueError(f"the group has {size} ranks and this is rank {dist.get_rank(group)}; the expert map "
                             f"wants ep_size={expert_map.ep_size} and ep_rank={ep_rank}")
        self.expert_map = expert_map
        self.ep_rank = ep_rank
        self.group = group
        self.counters = AllToAllCounters()
        self._rank_of = expert_map.rank_table(device)  # [num_experts] int64
        self._local_of = expert_map.local_table(device)  # [num_experts] int64

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> DispatchedTokens:
        """See `ExpertDispatcher.dispatch`.

        Raises:
            ValueError: the three inputs disagree on [num_tokens, top_k].
        """
        num_tokens, top_k = topk_ids.shape
        if hidden.shape[0] != num_tokens or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"hidden {tuple(hidden.shape)}, topk_ids {tuple(topk_ids.shape)} and topk_weights "
                             f"{tuple(topk_weights.shape)} must agree on [num_tokens, top_k]")
        ep = self.expert_map.ep_size
        flat_ids = topk_ids.reshape(-1)
        dest = self._rank_of[flat_ids]
        # stable: within one destination the pairs keep pair order, as the contract wants
        send_order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=ep)
        recv_counts = torch.empty_like(send_counts)
        ones = [1] * ep
        self._exchange(recv_counts, send_counts, ones, ones, "metadata")
        send_splits, recv_splits = send_counts.tolist(), recv_counts.tolist()

        recv_rows = hidden.new_empty(sum(recv_splits), hidden.shape[1])
        self._exchange(recv_rows, hidden[send_order // top_k], recv_splits, send_splits, "dispatch")
        send_local = self._local_of[flat_ids[send_order]]
        recv_local = send_local.new_empty(sum(recv_splits))
        self._exchange(recv_local, send_local, recv_splits, send_splits, "metadata")

        self.counters.num_dispatches += 1
        self.counters.rows_sent += sum(send_splits)
        self.counters.rows_received += sum(recv_splits)
        handle = DispatchHandle(num_tokens=num_tokens, top_k=top_k, send_order=send_order, topk_weights=topk_weights,
                                send_splits=tuple(send_splits), recv_splits=tuple(recv_splits))
        return DispatchedTokens(recv_rows, recv_local, handle)

    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle) -> torch.Tensor:
        """See `ExpertDispatcher.combine`.

        Raises:
            ValueError: ``expert_out`` does not have a row per row the dispatch received.
        """
        if expert_out.shape[0] != sum(handle.recv_splits):
            raise ValueError(f"expert_out has {expert_out.shape[0]} rows; its dispatch received "
                             f"{sum(handle.recv_splits)}")
        returned = expert_out.new_empty(len(handle.send_order), expert_out.shape[1])
        # the reverse exchange: what came from rank r goes back to it
        self._exchange(returned, expert_out.contiguous(), list(handle.send_splits), list(handle.recv_splits), "combine")
        self.counters.num_combines += 1
        pair_rows = torch.empty_like(returned)
        pair_rows[handle.send_order] = returned
        return weighted_sum(pair_rows, handle.topk_weights)

    def _exchange(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
                  kind: Literal["dispatch", "combine", "metadata"]) -> None:
        """One all_to_all_single, counted from the buffer it sends (measured, not modelled: the
        reference's formula is the oracle these counts are tested against) and timed around the
        call (on a GPU the collective is asynchronous to the host: the time is then what the host
        waited, not the transfer's)."""
        start_s = time.perf_counter()
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)
        self.counters.exchange_s += time.perf_counter() - start_s
        row_bytes = math.prod(inp.shape[1:]) * inp.element_size()  # a 0-row input still has a row size
        local = in_splits[self.ep_rank] * row_bytes
        remote = sum(in_splits) * row_bytes - local
        c = self.counters
        c.num_all_to_all_calls += 1
        if kind == "dispatch":
            c.dispatch_payload_bytes += remote
            c.local_bytes += local
        elif kind == "combine":
            c.combine_payload_bytes += remote
            c.local_bytes += local
        else:
            c.metadata_bytes += remote


if TYPE_CHECKING:
    from disaggsdk.engine.expert_parallel.base import ExpertDispatcher

    def _implements_the_contract(dispatcher: AllToAllDispatcher) -> ExpertDispatcher:
        return dispatcher  # mypy checks here that the class satisfies the Protocol
