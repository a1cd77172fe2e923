"""The experts' products of a mixture of experts as one op, without waiting for the routing.

The rows (token copies, one per chosen expert) are sorted by expert; expert g multiplies rows
[group_ends[g - 1], group_ends[g]). Nothing here reads the group ends on the host: bfloat16 with
packed weights runs the AMX kernel (`amx_linear.grouped`), which reads them itself; other dtypes
run ``torch._grouped_mm`` (per-group GEMMs inside ATen; on CUDA, a capturable kernel). So a
compiled step holds the whole MoE layer, with no graph break around a per-expert Python loop and no
``.tolist()``. It is a graph op of our own because the compiler's shape rule for
``torch._grouped_mm`` admits only bfloat16.
"""

from __future__ import annotations

import torch

from disaggsdk.engine.models.layers import amx_linear


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, group_ends: torch.Tensor,
                    packed: torch.Tensor | None) -> torch.Tensor:
    if packed is not None and x.dtype == torch.bfloat16 and x.device.type == "cpu":
        return amx_linear.grouped(x, packed, group_ends)
    return torch._grouped_mm(x, weight.transpose(1, 2), offs=group_ends.to(torch.int32))


_LIBRARY = torch.library.Library("disaggsdk", "FRAGMENT")
_LIBRARY.define("grouped_linear(Tensor x, Tensor weight, Tensor group_ends, Tensor? packed) -> Tensor")
_LIBRARY.impl("grouped_linear", _grouped_linear, "CompositeExplicitAutograd")


@torch.library.register_fake("disaggsdk::grouped_linear", lib=_LIBRARY)
def _(x: torch.Tensor, weight: torch.Tensor, group_ends: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[1])


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, group_ends: torch.Tensor,
                   packed: torch.Tensor | None = None) -> torch.Tensor:
    """Each expert's rows of x times its weight.

    Args:
        x: [rows, in_features], rows sorted by expert.
        weight: [experts, out_features, in_features].
        group_ends: [experts] integer, the end of each expert's rows (non-decreasing, last = rows).
        packed: ``amx_linear.pack(weight)`` (bfloat16 on an AMX CPU), or None.
    Returns:
        [rows, out_features]; row r is ``F.linear(x[r], weight[g])`` for its expert g.
    """
    return torch.ops.disaggsdk.grouped_linear(x, weight, group_ends, packed)
