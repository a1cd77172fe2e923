"""`skinny.linear`: the few-row matmul of decoding equals F.linear, takes its fast path only where
it was measured to help, and keeps F.linear elsewhere."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from disaggsdk.engine.models.layers import skinny  # noqa: E402


@pytest.mark.parametrize("rows", [1, 2, 3, 8, skinny.MAX_ROWS, skinny.MAX_ROWS + 1, 100])
@pytest.mark.parametrize("shape", [(4096, 256), (256, 128)], ids=["large", "small"])
def test_equals_f_linear_and_is_contiguous(rows, shape):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(*shape, generator=gen)
    x = torch.randn(rows, shape[1], generator=gen)
    y = skinny.linear(x, weight)
    assert y.shape == (rows, shape[0]) and y.is_contiguous()
    torch.testing.assert_close(y, F.linear(x, weight), rtol=1e-4, atol=1e-4)  # float32 rounding of sums of ~16


def test_the_fast_path_runs_only_for_few_float32_rows(monkeypatch):
    calls = []
    real = F.linear
    monkeypatch.setattr(skinny.F, "linear", lambda x, w: calls.append(x.shape[0]) or real(x, w))
    big, small = torch.randn(1024, 256), torch.randn(64, 256)
    skinny.linear(torch.randn(2, 256), big)  # the GEMM orientation of decoding
    skinny.linear(torch.randn(1, 256), big)  # one row, duplicated: large weight
    assert calls == []
    skinny.linear(torch.randn(1, 256), small)  # one row, small weight: GEMV is as fast
    skinny.linear(torch.randn(skinny.MAX_ROWS + 1, 256), big)  # a prefill chunk
    skinny.linear(torch.randn(2, 256, dtype=torch.bfloat16), big.bfloat16())  # oneDNN's own
    assert calls == [1, skinny.MAX_ROWS + 1, 2]
