"""The experts' products of a mixture of experts as one op, without waiting for the routing."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from disaggsdk.engine.modeling.layers import amx_linear


def _grouped_linear(x: torch.Tensor, weight: torch.Tensor, group_ends: torch.Tensor,
                    packed: torch.Tensor | None) -> torch.Tensor:
    if x.device.type == "cpu" and packed is not None and x.dtype == torch.bfloat16:
        return amx_linear.grouped(x, packed, group_ends)
    if x.device.type == "cpu" or x.dtype == torch.bfloat16:
        return torch._grouped_mm(x, weight.transpose(1, 2), offs=group_ends.to(torch.int32))
    return _per_group(x, weight, group_ends)


def _per_group(x: torch.Tensor, weight: torch.Tensor, group_ends: torch.Tensor) -> torch.Tensor:
    """The products one expert at a time, the ends read on the host (a device sync)."""
    products, start = [], 0
    for expert, end in enumerate(group_ends.tolist()):
        products.append(F.linear(x[start:end], weight[expert]))
        start = end
    return torch.cat(products)


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
