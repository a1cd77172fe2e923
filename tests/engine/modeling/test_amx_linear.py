"""`amx_linear`: the packed bfloat16 AMX kernel equals torch's bfloat16 F.linear bit for bit, the
packing is AMX's layout, and a bfloat16 model on this CPU packs its weights and decodes through the
kernel with the tokens of F.linear."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from disaggsdk.engine.modeling import build_model  # noqa: E402
from disaggsdk.engine.modeling.layers import amx_linear, skinny  # noqa: E402
from disaggsdk.engine.parallel import TensorParallel  # noqa: E402
from tests.declared_skips import cpu_lacks  # noqa: E402

# a kernel that did not build is a broken install, not a skip: its test fails (tests/declared_skips.py)
needs_amx = pytest.mark.skipif(amx_linear.kernel_built() and not amx_linear.available(),
                               reason=cpu_lacks("AMX", "the bfloat16 AMX kernel needs AMX tiles (or DISAGGSDK_AMX_LINEAR=0)"))


def test_the_kernel_is_built_in_this_install():
    """`make install` builds native/cpu_linear/ (it needs only a C compiler), on every CPU: a failed
    build is a broken install, whether or not this CPU has the AMX that runs it."""
    assert amx_linear.kernel_built()


def test_pack_is_the_vnni_tile_layout():
    out_features, in_features = 32, 64
    weight = torch.arange(out_features * in_features, dtype=torch.float32).reshape(out_features, in_features).bfloat16()
    packed = amx_linear.pack(weight)
    assert packed.shape == (2, 2, 16, 32) and packed.is_contiguous()
    for nb, kb, i, n in [(0, 0, 0, 0), (1, 0, 3, 5), (0, 1, 15, 15), (1, 1, 7, 2)]:
        feature, pair = 16 * nb + n, 32 * kb + 2 * i
        assert packed[nb, kb, i, 2 * n] == weight[feature, pair]
        assert packed[nb, kb, i, 2 * n + 1] == weight[feature, pair + 1]
    experts = torch.stack([weight, weight + 1])
    assert torch.equal(amx_linear.pack(experts)[1], amx_linear.pack(weight + 1))


def test_can_pack_only_bfloat16_tiles():
    assert amx_linear.can_pack(torch.zeros(16, 32, dtype=torch.bfloat16))
    assert amx_linear.can_pack(torch.zeros(4, 48, 64, dtype=torch.bfloat16))
    assert not amx_linear.can_pack(torch.zeros(16, 32))  # float32 keeps its own path
    assert not amx_linear.can_pack(torch.zeros(24, 32, dtype=torch.bfloat16))  # out not a multiple of 16
    assert not amx_linear.can_pack(torch.zeros(16, 40, dtype=torch.bfloat16))  # in not a multiple of 32


@needs_amx
@pytest.mark.parametrize("rows", [1, 2, 15, 16, 17, 31, 32, 33, 70])
@pytest.mark.parametrize("shape", [(16, 32), (48, 96), (384, 256), (1024, 512)])
def test_kernel_equals_bfloat16_f_linear(rows, shape):
    gen = torch.Generator().manual_seed(rows * 7 + shape[0])
    weight = (torch.randn(*shape, generator=gen) * 0.05).bfloat16()
    wide = torch.randn(rows, shape[1] + 32, generator=gen).bfloat16()
    x = wide[:, 16 : 16 + shape[1]]  # rows further apart than in_features: the kernel reads the stride
    y = torch.ops.disaggsdk.amx_linear(x, amx_linear.pack(weight))
    assert y.shape == (rows, shape[0]) and y.dtype == torch.bfloat16
    expected = F.linear(x, weight)
    # the same exact products summed in float32 and rounded once: bit-identical to oneDNN's bfloat16
    # matmul here; allow a one-ulp tie-break elsewhere (a different summation order)
    torch.testing.assert_close(y.float(), expected.float(), rtol=2 ** -7, atol=1e-6)
    if rows <= 32:
        assert torch.equal(y, expected)


@needs_amx
def test_skinny_linear_takes_the_kernel_for_few_bfloat16_rows_only(monkeypatch):
    weight = torch.randn(64, 32).bfloat16()
    packed = amx_linear.pack(weight)
    calls = []
    real = torch.ops.disaggsdk.amx_linear
    monkeypatch.setattr(torch.ops.disaggsdk, "amx_linear", lambda x, p: calls.append(x.shape[0]) or real(x, p))
    skinny.linear(torch.randn(3, 32).bfloat16(), weight, packed)
    skinny.linear(torch.randn(skinny.MAX_ROWS + 1, 32).bfloat16(), weight, packed)  # prefill: F.linear
    skinny.linear(torch.randn(3, 32).bfloat16(), weight)  # not packed
    assert calls == [3]


@needs_amx
@pytest.mark.parametrize("model", ["qwen3-tiny", "qwen3-coder-tiny", "deepseek-r1-tiny"])
def test_a_bfloat16_model_packs_its_weights_and_decodes_as_with_f_linear(model, monkeypatch):
    tp = TensorParallel(rank=0, size=1)
    with torch.inference_mode():
        packed_model = build_model(model, tp, dtype="bfloat16", load_format="dummy", seed=5)
        plain = build_model(model, tp, dtype="bfloat16", load_format="dummy", seed=5)
        assert amx_linear.pack_model(packed_model) > 0
        head = packed_model.packed_head
        assert head is not None and torch.equal(head, amx_linear.pack(packed_model._head_weight()))
        monkeypatch.setenv(amx_linear.ENV, "0")
        monkeypatch.setattr(amx_linear, "_available", None)
        assert amx_linear.pack_model(plain) == 0  # turned off: nothing packed, F.linear throughout
        monkeypatch.setattr(amx_linear, "_available", True)
        calls = []
        real = torch.ops.disaggsdk.amx_linear
        monkeypatch.setattr(torch.ops.disaggsdk, "amx_linear", lambda x, p: calls.append(p.shape) or real(x, p))
        hidden = torch.randn(4, packed_model.arch.hidden_size).bfloat16()
        assert torch.equal(packed_model.compute_logits(hidden), plain.compute_logits(hidden))
        assert calls, "the head went through the kernel"
        if model != "qwen3-tiny":  # MoE: the experts' few rows go through it too
            moe = next(m for m in packed_model.modules() if hasattr(m, "packed_w13"))
            assert moe.packed_w13 is not None and moe.packed_w13.shape[0] == moe.w13.shape[0]


@needs_amx
def test_a_bfloat16_engine_generates_the_tokens_of_f_linear_and_calls_the_kernel(monkeypatch):
    """Eager steps (a compiled step may fuse a residual add into oneDNN's matmul, a second rounding
    fewer, so its bfloat16 tokens can differ from eager PyTorch's either way)."""
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.engine.sampling_params import SamplingParams

    config = EngineConfig(page_size=16, num_pages=64, dtype="bfloat16", compile=False)
    prompts = [[5 + i, 17, 3 * i + 1, 40, 9] for i in range(6)]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    monkeypatch.setattr(amx_linear, "_available", False)
    with LLMEngine("qwen3-coder-tiny", config) as engine:
        expected = [o.output_ids for o in engine.generate(prompts, params)]
    monkeypatch.setattr(amx_linear, "_available", True)
    calls = []
    real = torch.ops.disaggsdk.amx_linear
    monkeypatch.setattr(torch.ops.disaggsdk, "amx_linear", lambda x, p: calls.append(x.shape[0]) or real(x, p))
    with LLMEngine("qwen3-coder-tiny", config) as engine:
        assert [o.output_ids for o in engine.generate(prompts, params)] == expected
    assert 6 in calls  # the decode steps of the six requests went through the kernel
