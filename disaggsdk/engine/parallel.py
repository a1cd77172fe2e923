"""Tensor-parallel context passed explicitly to every layer (no module-level process group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in its tensor-parallel group.

    ``group`` is a torch.distributed process group (gloo on CPU, NCCL on GPU), or None when
    ``size == 1``; collectives are then no-ops.
    """

    rank: int = 0
    size: int = 1
    group: ProcessGroup | None = None

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

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        """Concatenate each rank's ``x`` along the last dimension, in rank order."""
        if self.size == 1:
            return x
        import torch
        import torch.distributed as dist

        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

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
