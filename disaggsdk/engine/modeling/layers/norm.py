"""RMSNorm, computed as transformers does (in float32, weight applied in the input dtype)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from disaggsdk.engine.weights import WeightSlot


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps) over the last dimension; replicated on every rank."""

    def __init__(self, name: str, dim: int, eps: float, dtype: torch.dtype, optional_group: str | None = None):
        super().__init__()
        self.name = name
        self.eps = eps
        self.optional_group = optional_group
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), requires_grad=False)  # [dim]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def own_slots(self) -> Iterator[WeightSlot]:
        yield WeightSlot(
            self.name, self.weight.data, tuple(self.weight.shape), init="ones",
            optional_group=self.optional_group,
        )
