"""The experts' products of a mixture of experts as one op, without waiting for the routing.

The rows (token copies, one per chosen expert) are sorted by expert; expert g multiplies rows
[group_ends[g - 1], group_ends[g]). On a CPU nothing reads the group ends from Python: bfloat16
with packed weights runs the AMX kernel (`amx_linear.grouped`), which reads them itself, and other
dtypes run ``torch._grouped_mm`` (per-group GEMMs inside ATen). On CUDA, bfloat16 runs
``torch._grouped_mm``'s grouped kernel (no host sync: capturable); its CUDA kernel takes only
bfloat16, so other dtypes there loop over the experts with the ends read on the host (a sync, as
before this op). To the compiler it is one opaque op, so a compiled step holds the whole MoE layer:
no graph break around a per-expert loop. It is an op of our own because the compiler's shape rule
for ``torch._grouped_mm`` admits only bfloat16.
"""

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
