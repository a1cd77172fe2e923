"""Tensor-parallel context passed explicitly to every layer (no module-level process group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from disaggsdk.engine.expert_parallel.base import ExpertDispatcher


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in its tensor-parallel group.

    ``group`` is a torch.distributed process group (gloo on CPU, NCCL on GPU), or None when
    ``size == 1``; collectives are then no-ops.

    ``experts`` is this rank's side of the expert-parallel exchange when the MoE layers' routed
    experts are spread over ranks (``ep > 1``: the group is every rank of the instance, tp x dp);
    None: every rank holds a tp slice of every expert. It travels with the tp context because
    the layers that need it are built from it, and an expert-parallel rank is always also a rank
    of its dp group's tp (the tokens it dispatches are its tp share of that group's).
    """

    rank: int = 0
    size: int = 1
    group: ProcessGroup | None = None
    experts: ExpertDispatcher | None = None

    @property
    def is_head(self) -> bool:
        """The rank that speaks for the instance (messenger, sampling, layer counter)."""
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the group in place and return it."""
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(x, group=self.group)
        return x

    def token_rows(self, num_tokens: int) -> tuple[int, int]:
        """The [start, stop) of the rows this rank dispatches to the experts when tokens are
        replicated over the tp ranks (each sends a share, so no pair is sent twice); shares
        differ by at most one row, and a rank may get none."""
        return num_tokens * self.rank // self.size, num_tokens * (self.rank + 1) // self.size

    def shard(self, n: int) -> tuple[int, int]:
        """The [start, stop) of this rank's equal share of ``n`` items (n divisible by size)."""
        if n % self.size:
            raise ValueError(f"{n} items cannot be split evenly over tp={self.size}")
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per

    def kv_head_range(self, num_kv_heads: int) -> tuple[int, int]:
        """KV heads this rank holds: its share when tp <= heads, else one replicated head."""
        if self.size <= num_kv_heads:
            return self.shard(num_kv_heads)
        ranks_per_head = self.size // num_kv_heads
        head = self.rank // ranks_per_head
        return head, head + 1
