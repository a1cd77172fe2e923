"""The dispatch / combine contract of expert parallelism: one MoE layer's token exchange.

Every rank of an expert-parallel group routes its own tokens (top-k expert ids and weights). A
call of `ExpertDispatcher.dispatch` is collective: each rank sends every (token, slot) pair to the
rank holding that slot's expert and receives the pairs its local experts must run. The rank runs
its experts on the received rows, unweighted, and `ExpertDispatcher.combine` (collective too) sends
each row's output back to the rank that owns the token, which weights the k outputs and sums them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.expert_parallel.expert_map import ExpertMap


@dataclass(frozen=True)
class DispatchHandle:
    """What combine needs from its dispatch, kept on the sending rank (nothing of it is sent).

    ``send_splits[r]`` rows went to rank r and ``recv_splits[r]`` rows came from it; combine
    reverses the exchange with the two swapped.
    """

    num_tokens: int  # T of the dispatched hidden
    top_k: int
    send_order: torch.Tensor  # [num_tokens * top_k], int64: the pair index of each sent row, in send order
    topk_weights: torch.Tensor  # [num_tokens, top_k], float32, the weights combine applies
    send_splits: tuple[int, ...]  # [ep_size]: rows sent to each rank
    recv_splits: tuple[int, ...]  # [ep_size]: rows received from each rank


@dataclass(frozen=True)
class DispatchedTokens:
    """The rows this rank's local experts must run, in the contract's order (see the module doc)."""

    hidden: torch.Tensor  # [num_recv_rows, hidden_size], the dtype dispatched
    local_expert_ids: torch.Tensor  # [num_recv_rows], int64, index into this rank's local experts
    handle: DispatchHandle


@dataclass
class AllToAllCounters:
    """What one rank's dispatcher moved since it was made: the measured side of the simulator's
    all-to-all term (sim.cost_model), which charges the payload bytes that leave a rank.

    ``*_payload_bytes`` count the hidden-state rows this rank sends to *other* ranks: in dispatch
    its tokens' rows, in combine the outputs it returns for other ranks' tokens (so under skewed
    routing the expert-heavy rank sends most of the combine). Rows that stay on this rank are
    copied, not sent, and count in ``local_bytes`` (both directions). ``metadata_bytes`` are the
    split counts and expert ids that make the exchange possible, to other ranks as well.
    Mutable on purpose: a dispatcher adds to its own record; `since` gives one step's share.

    ``exchange_s`` is measured, not counted: wall seconds this rank spent inside its collectives
    (every ``all_to_all_single``, metadata ones included). A collective returns only when the
    slowest rank has joined it, so the figure includes waiting for the other ranks to reach the
    same MoE layer (their attention, routing and experts, and any load on their cores), not only
    moving bytes. A dispatcher that moves nothing over a wire (the single-process reference,
    `torch_ref`) leaves it 0. Everything else here is exact and equal across implementations
    (`counts`).
    """

    num_dispatches: int = 0
    num_combines: int = 0
    num_all_to_all_calls: int = 0  # collectives issued, metadata ones included
    dispatch_payload_bytes: int = 0
    combine_payload_bytes: int = 0
    metadata_bytes: int = 0
    local_bytes: int = 0
    # rows by direction, pairs kept local included: a check on routing balance, not on bytes
    rows_sent: int = 0
    rows_received: int = 0
    exchange_s: float = 0.0  # wall time inside the collectives, waiting for the slowest rank included

    @property
    def payload_bytes(self) -> int:
        """Hidden-state bytes sent to other ranks, dispatch and combine together."""
        return self.dispatch_payload_bytes + self.combine_payload_bytes

    def since(self, earlier: AllToAllCounters) -> AllToAllCounters:
        """The counts added after ``earlier`` (a `copy` taken before), e.g. one step's."""
        return AllToAllCounters(**{f.name: getattr(self, f.name) - getattr(earlier, f.name)
                                   for f in fields(self)})

    def copy(self) -> AllToAllCounters:
        """A snapshot that later calls do not change."""
        return replace(self)

    def counts(self) -> dict[str, int]:
        """The exact fields (calls, rows, bytes) by name, without the measured ``exchange_s``: what two
        implementations of the contract must agree on to the unit."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _MEASURED}


_MEASURED = frozenset({"exchange_s"})  # fields of AllToAllCounters that are timed, not counted


def weighted_sum(pair_rows: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    """The combine's reduction, shared by every implementation so they agree to the bit.

    Args:
        pair_rows: [num_tokens * top_k, hidden_size], expert outputs in pair order.
        topk_weights: [num_tokens, top_k], float32.
    Returns:
        [num_tokens, hidden_size] in ``pair_rows``' dtype: slot 0 + slot 1 + ..., in that order
        (an explicit loop rather than ``sum(dim=1)``, whose reduction order torch does not promise).
    """
    num_tokens, top_k = topk_weights.shape
    rows = pair_rows.view(num_tokens, top_k, pair_rows.shape[1])  # -1 is ambiguous at num_tokens 0
    weights = topk_weights.to(pair_rows.dtype)
    out = rows[:, 0] * weights[:, 0, None]
    for slot in range(1, top_k):
        out = out + rows[:, slot] * weights[:, slot, None]
    return out


class ExpertDispatcher(Protocol):
    """One rank's side of the expert-parallel exchange over its group.

    Both calls are collectives: every rank of the group makes them in the same order, a rank
    without tokens included (it dispatches ``[0, hidden_size]``), or the group hangs.
    """

    expert_map: ExpertMap
    ep_rank: int
    counters: AllToAllCounters

    def dispatch(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> DispatchedTokens:
        """Send each (token, slot) pair to the rank of its expert; receive this rank's pairs.

        Args:
            hidden: [num_tokens, hidden_size], this rank's tokens (num_tokens may be 0).
            topk_ids: [num_tokens, top_k], int64 global expert ids in ``[0, num_experts)``.
            topk_weights: [num_tokens, top_k], float32 routing weights (kept here for combine).
        Returns:
            The received rows, their local expert ids and the handle combine takes.
        """
        ...

    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle) -> torch.Tensor:
        """Return each received row's expert output to its token's rank and reduce there.

        Args:
            expert_out: [num_recv_rows, hidden_size], the local experts' unweighted outputs,
                row for row of the `DispatchedTokens` this handle came with.
            handle: that dispatch's handle.
        Returns:
            [num_tokens, hidden_size]: per token, sum over slots of weight x expert output,
            in the tokens' original order, in ``expert_out``'s dtype.
        """
        ...
