"""`grouped_linear`: each expert's rows times its weight, as one graph op, equal to a per-expert
F.linear loop (empty experts included); and a MoE layer compiles into one graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from disaggsdk.engine.modeling.layers import amx_linear  # noqa: E402
from disaggsdk.engine.modeling.layers import grouped_linear as _grouped  # noqa: E402
from disaggsdk.engine.modeling.layers.grouped_linear import grouped_linear  # noqa: E402
from disaggsdk.engine.modeling.layers.moe import Experts  # noqa: E402
from disaggsdk.engine.parallel import TensorParallel  # noqa: E402


def _per_expert(x, weight, ends):
    out, start = [], 0
    for expert, end in enumerate(ends.tolist()):
        out.append(F.linear(x[start:end], weight[expert]))
        start = end
    return torch.cat(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ends", [[2, 2, 5, 5, 5, 9], [0, 0, 0, 0, 0, 1], [1, 2, 3, 4, 5, 6]])
def test_equals_a_per_expert_loop(dtype, ends):
    gen = torch.Generator().manual_seed(len(ends) + ends[0])
    weight = (torch.randn(6, 48, 64, generator=gen) * 0.1).to(dtype)
    x = torch.randn(ends[-1], 64, generator=gen).to(dtype)
    group_ends = torch.tensor(ends)
    expected = _per_expert(x, weight, group_ends)
    torch.testing.assert_close(grouped_linear(x, weight, group_ends), expected)
    # the loop other devices' non-bfloat16 inputs take (here on CPU tensors)
    torch.testing.assert_close(_grouped._per_group(x, weight, group_ends), expected)
    packed = amx_linear.pack_if_useful(weight)
    if dtype == torch.bfloat16 and amx_linear.available():
        assert packed is not None
        assert torch.equal(grouped_linear(x, weight, group_ends, packed), expected)  # the AMX kernel's


def test_a_moe_layer_compiles_into_one_graph_and_keeps_its_values():
    experts = Experts("e.", 8, 64, 32, TensorParallel(rank=0, size=1), torch.float32)
    gen = torch.Generator().manual_seed(0)
    experts.w13.data.copy_(torch.randn(experts.w13.shape, generator=gen) * 0.1)
    experts.w2.data.copy_(torch.randn(experts.w2.shape, generator=gen) * 0.1)
    x = torch.randn(5, 64, generator=gen)
    ids = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(5)])
    weights = torch.rand(5, 2, generator=gen)
    with torch.inference_mode():
        explained = torch._dynamo.explain(experts)(x, ids, weights)
        assert explained.graph_break_count == 0 and explained.graph_count == 1
        expected = torch.zeros_like(x)
        for t in range(5):
            for slot in range(2):
                e = int(ids[t, slot])
                gate, up = F.linear(x[t], experts.w13[e]).chunk(2)
                expected[t] += weights[t, slot] * F.linear(F.silu(gate) * up, experts.w2[e])
        torch.testing.assert_close(experts(x, ids, weights), expected)
