"""`skinny.linear`: the few-row matmul of decoding equals F.linear, takes its fast path only where
it was measured to help, and keeps F.linear elsewhere."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from disaggsdk.engine.modeling.layers import skinny  # noqa: E402


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


def test_calibration_keeps_the_faster_form_per_shape_and_linear_follows_it(monkeypatch):
    """auto: each weight shape (one row, and a few) is timed once per process; `linear` takes the
    form the table says, and the fixed rules still come first (few rows only, large one-row weights)."""
    monkeypatch.setattr(skinny, "MODE", "auto")
    monkeypatch.setattr(skinny, "_faster", {})
    experts = torch.randn(4, 128, 64)  # a stack of experts counts as its [out, in] slices
    table = skinny.calibrate([torch.randn(96, 64), experts, torch.randn(8, dtype=torch.float32),
                              torch.randn(96, 64, dtype=torch.bfloat16)])
    assert set(table) == {(96, 64, False), (128, 64, False)}  # small weights: one row is never duplicated
    assert skinny.calibrate([torch.randn(96, 64)]) == table  # measured once
    calls = []
    real = F.linear
    monkeypatch.setattr(skinny.F, "linear", lambda x, w: calls.append(tuple(w.shape)) or real(x, w))
    monkeypatch.setattr(skinny, "_faster", {(96, 64, False): False, (128, 64, False): True})
    x = torch.randn(3, 64)
    torch.testing.assert_close(skinny.linear(x, torch.ones(96, 64)), real(x, torch.ones(96, 64)))
    skinny.linear(x, torch.ones(128, 64))
    skinny.linear(x, torch.ones(32, 64))  # never measured: the fixed rule (transposed)
    assert calls == [(96, 64)]


def test_off_and_on_modes_ignore_the_table(monkeypatch):
    calls = []
    real = F.linear
    monkeypatch.setattr(skinny.F, "linear", lambda x, w: calls.append(x.shape[0]) or real(x, w))
    monkeypatch.setattr(skinny, "_faster", {(64, 32, False): False})
    monkeypatch.setattr(skinny, "MODE", "on")
    assert skinny.calibrate([torch.randn(16, 32)]) == {(64, 32, False): False}  # nothing measured
    skinny.linear(torch.randn(2, 32), torch.randn(64, 32))
    assert calls == []
    monkeypatch.setattr(skinny, "MODE", "off")
    skinny.linear(torch.randn(2, 32), torch.randn(16, 32))
    assert calls == [2]
