"""The gated (SwiGLU) MLP, its intermediate dimension split over tensor-parallel ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from disaggsdk.engine.modeling.layers.linear import ColumnParallelLinear, OutputPart, RowParallelLinear
from disaggsdk.engine.parallel import TensorParallel


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)); returns this rank's partial sum (the caller all-reduces)."""

    def __init__(self, prefix: str, hidden_size: int, intermediate_size: int, tp: TensorParallel,
                 dtype: torch.dtype, optional_group: str | None = None):
        super().__init__()
        rows = tp.shard(intermediate_size)
        self.gate_up = ColumnParallelLinear(
            hidden_size,
            [OutputPart(f"{prefix}gate_proj.weight", intermediate_size, rows),
             OutputPart(f"{prefix}up_proj.weight", intermediate_size, rows)],
            dtype, optional_group,
        )
        self.down = RowParallelLinear(f"{prefix}down_proj.weight", intermediate_size, rows, hidden_size,
                                      dtype, optional_group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)
