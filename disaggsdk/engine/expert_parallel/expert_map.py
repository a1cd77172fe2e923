"""Which expert-parallel rank holds which routed experts of a MoE layer (vLLM's expert map).

The experts are split in contiguous runs; when ``ep_size`` does not divide ``num_experts`` the
first ``num_experts % ep_size`` ranks hold one more. The split itself is
`disaggsdk.plan.memory.expert_range`: the memory plan sizes each rank's weights with it, so the
engine and the plan read one definition and cannot disagree about where an expert lives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from disaggsdk.plan.memory import expert_range

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ExpertMap:
    """The placement of ``num_experts`` routed experts over ``ep_size`` ranks.

    Args:
        num_experts: routed experts of one MoE layer (shared experts are not placed here).
        ep_size: ranks of the expert-parallel group. May exceed ``num_experts``: the last ranks then
            hold no expert and receive no token.
    Raises:
        ValueError: a count below 1.
    """

    num_experts: int
    ep_size: int

    def __post_init__(self) -> None:
        if self.num_experts < 1 or self.ep_size < 1:
            raise ValueError(f"an expert map needs num_experts >= 1 and ep_size >= 1, "
                             f"got num_experts={self.num_experts}, ep_size={self.ep_size}")

    def expert_range(self, ep_rank: int) -> tuple[int, int]:
        """The global expert ids ``[start, stop)`` rank ``ep_rank`` holds."""
        if not 0 <= ep_rank < self.ep_size:
            raise ValueError(f"ep_rank {ep_rank} is outside [0, {self.ep_size})")
        return expert_range(self.num_experts, self.ep_size, ep_rank)

    def num_local_experts(self, ep_rank: int) -> int:
        """How many experts rank ``ep_rank`` holds."""
        start, stop = self.expert_range(ep_rank)
        return stop - start

    def rank_of(self, expert_id: int) -> int:
        """The rank that holds global expert ``expert_id``."""
        return self.locate(expert_id)[0]

    def locate(self, expert_id: int) -> tuple[int, int]:
        """(rank, local index on that rank) of global expert ``expert_id``.

        Raises:
            ValueError: ``expert_id`` is outside ``[0, num_experts)``.
        """
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"expert id {expert_id} is outside [0, {self.num_experts})")
        # a linear scan over ranks: ep is small, and this is for tables and tests, not the hot path
        for rank in range(self.ep_size):
            start, stop = self.expert_range(rank)
            if start <= expert_id < stop:
                return rank, expert_id - start
        raise AssertionError("expert_range covers every expert")

    def global_to_local(self, ep_rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """vLLM's expert map of one rank: ``[num_experts]`` int64, the local index of each global
        expert this rank holds and -1 for the others."""
        import torch

        table = torch.full((self.num_experts,), -1, dtype=torch.int64, device=device)
        start, stop = self.expert_range(ep_rank)
        table[start:stop] = torch.arange(stop - start, dtype=torch.int64, device=device)
        return table

    def rank_table(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[num_experts]`` int64: the rank holding each global expert (what dispatch indexes by)."""
        import torch

        sizes = [self.num_local_experts(r) for r in range(self.ep_size)]
        return torch.repeat_interleave(torch.arange(self.ep_size, device=device),
                                       torch.tensor(sizes, device=device))

    def local_table(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[num_experts]`` int64: each global expert's local index on the rank that holds it."""
        import torch

        starts = torch.tensor([self.expert_range(self.rank_of(e))[0] for e in range(self.num_experts)],
                              dtype=torch.int64, device=device)
        return torch.arange(self.num_experts, device=device) - starts
