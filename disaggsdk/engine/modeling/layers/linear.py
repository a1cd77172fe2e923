"""Linear layers split over tensor-parallel ranks, each naming the checkpoint tensors it holds.

Column parallel: this rank keeps a range of output rows (several checkpoint tensors may be
stacked into one weight, e.g. q|k|v or gate|up, so one matmul serves them). Row parallel: this
rank keeps a range of input columns and produces a partial sum; the caller all-reduces, so that
several partial sums (routed + shared experts) share one all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from disaggsdk.engine.modeling.layers import amx_linear, skinny
from disaggsdk.engine.weights import WeightSlot


@dataclass(frozen=True)
class OutputPart:
    """One checkpoint tensor stacked into a column-parallel weight."""

    name: str  # checkpoint tensor name
    full_rows: int  # its output rows in the checkpoint
    rows: tuple[int, int]  # [start, stop) of the rows this rank keeps


class _Linear(nn.Module):
    """y = x W^T with ``self.weight`` [out_features, in_features], and its decode-time packed form."""

    weight: nn.Parameter  # [out_features, in_features]: set by the subclass
    packed: torch.Tensor | None  # a buffer: amx_linear.pack(weight), or None

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("packed", None, persistent=False)  # amx_linear.pack(weight), or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return skinny.linear(x, self.weight, self.packed)

    def pack_for_decode(self) -> int:
        """Keep the weight in the AMX kernel's layout too, where that kernel runs (amx_linear).
        Returns how many tensors were packed (0 or 1)."""
        self.packed = amx_linear.pack_if_useful(self.weight)
        return int(self.packed is not None)


class ColumnParallelLinear(_Linear):
    """y = x W^T for this rank's output rows of one or several stacked checkpoint tensors."""

    def __init__(self, in_features: int, parts: list[OutputPart], dtype: torch.dtype, optional_group: str | None = None):
        super().__init__()
        self.parts = parts
        self.optional_group = optional_group
        num_rows = sum(p.rows[1] - p.rows[0] for p in parts)
        self.weight = nn.Parameter(torch.empty(num_rows, in_features, dtype=dtype), requires_grad=False)
        # weight: [sum of local rows, in_features]

    @property
    def split_sizes(self) -> list[int]:
        """Local output width of each part, in order (for torch.split of the output)."""
        return [p.rows[1] - p.rows[0] for p in self.parts]

    def own_slots(self) -> Iterator[WeightSlot]:
        offset = 0
        in_features = self.weight.shape[1]
        for part in self.parts:
            size = part.rows[1] - part.rows[0]
            shard = None if size == part.full_rows else 0
            yield WeightSlot(
                name=part.name,
                target=self.weight.data[offset : offset + size],
                full_shape=(part.full_rows, in_features),
                shard_dim=shard,
                shard=part.rows,
                optional_group=self.optional_group,
            )
            offset += size


class RowParallelLinear(_Linear):
    """Partial y = x_local W_local^T over this rank's input columns (caller all-reduces)."""

    def __init__(self, name: str, full_in: int, cols: tuple[int, int], out_features: int, dtype: torch.dtype,
                 optional_group: str | None = None):
        super().__init__()
        self.name = name
        self.full_in = full_in
        self.cols = cols
        self.optional_group = optional_group
        self.weight = nn.Parameter(torch.empty(out_features, cols[1] - cols[0], dtype=dtype), requires_grad=False)
        # weight: [out_features, local in_features]

    def own_slots(self) -> Iterator[WeightSlot]:
        split = self.cols[1] - self.cols[0] != self.full_in
        yield WeightSlot(
            name=self.name,
            target=self.weight.data,
            full_shape=(self.weight.shape[0], self.full_in),
            shard_dim=1 if split else None,
            shard=self.cols,
            optional_group=self.optional_group,
        )


def replicated_linear(name: str, in_features: int, out_features: int, dtype: torch.dtype,
                      optional_group: str | None = None) -> ColumnParallelLinear:
    """A linear layer every rank holds whole."""
    return ColumnParallelLinear(
        in_features, [OutputPart(name, out_features, (0, out_features))], dtype, optional_group
    )
