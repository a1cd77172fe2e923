"""`wide_gemm.linear`: prefill's many-row products on MKL or oneDNN, whichever calibration found
faster per weight shape; equal to F.linear either way, in eager and in the compiled step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.modeling.layers import skinny, wide_gemm  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402

needs_onednn = pytest.mark.skipif(not wide_gemm.onednn_available(), reason="torch has no oneDNN (mkldnn) here")


@needs_onednn
@pytest.mark.parametrize("rows", [33, 512, 1000])
@pytest.mark.parametrize("shape", [(384, 256), (256, 512)])
def test_onednn_equals_f_linear(rows, shape):
    gen = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(*shape, generator=gen), torch.randn(rows, shape[1], generator=gen)
    y = torch.ops.disaggsdk.onednn_linear(x, weight)
    assert y.shape == (rows, shape[0])
    torch.testing.assert_close(y, F.linear(x, weight), rtol=1e-4, atol=1e-4)


@needs_onednn
def test_calibration_keeps_onednn_only_where_it_wins_by_the_margin_and_linear_follows(monkeypatch):
    """auto: each float32 shape is timed once per process (a stack of experts as its [out, in]
    slice; other dtypes are not timed); oneDNN is kept where its time is under MIN_GAIN of MKL's."""
    monkeypatch.setattr(wide_gemm, "MODE", "auto")
    monkeypatch.setattr(wide_gemm, "_onednn_faster", {})
    timed = {(96, 64): (1.0, 2.0), (128, 64): (1.0, 1.05)}  # shape -> (oneDNN s, MKL s)
    monkeypatch.setattr(wide_gemm, "best_time_s", lambda fn, x, w, calls: timed[tuple(w.shape)][fn is F.linear])
    experts = torch.randn(4, 128, 64)
    table = wide_gemm.calibrate([torch.randn(96, 64), experts, torch.randn(96, 64, dtype=torch.bfloat16)])
    assert table == {(96, 64): True, (128, 64): False}
    monkeypatch.setattr(wide_gemm, "best_time_s", lambda *a: pytest.fail("a shape was timed twice"))
    assert wide_gemm.calibrate([torch.randn(96, 64)]) == table
    x = torch.randn(40, 64)
    assert wide_gemm.uses_onednn(torch.ones(96, 64)) and not wide_gemm.uses_onednn(torch.ones(128, 64))
    assert not wide_gemm.uses_onednn(torch.ones(32, 64))  # never measured: MKL
    assert not wide_gemm.uses_onednn(torch.ones(96, 64, dtype=torch.bfloat16))
    torch.testing.assert_close(wide_gemm.linear(x, torch.ones(96, 64)), F.linear(x, torch.ones(96, 64)))


def test_fixed_modes_ignore_the_table(monkeypatch):
    monkeypatch.setattr(wide_gemm, "_onednn_faster", {(64, 32): True})
    monkeypatch.setattr(wide_gemm, "MODE", "mkl")
    assert wide_gemm.calibrate([torch.randn(16, 32)]) == {(64, 32): True}  # nothing measured
    assert not wide_gemm.uses_onednn(torch.randn(64, 32))
    monkeypatch.setattr(wide_gemm, "MODE", "onednn")
    assert wide_gemm.uses_onednn(torch.randn(16, 32)) == wide_gemm.onednn_available()


def test_skinny_linear_sends_more_than_max_rows_to_the_wide_choice(monkeypatch):
    rows = []
    real = wide_gemm.linear
    monkeypatch.setattr(wide_gemm, "linear", lambda x, w: rows.append(x.shape[0]) or real(x, w))
    weight = torch.randn(64, 32)
    skinny.linear(torch.randn(skinny.MAX_ROWS, 32), weight)
    skinny.linear(torch.randn(skinny.MAX_ROWS + 1, 32), weight)
    skinny.linear(torch.randn(100, 32, dtype=torch.bfloat16), weight.bfloat16())  # F.linear: oneDNN's own
    assert rows == [skinny.MAX_ROWS + 1]


def _greedy_ids(compile: bool) -> tuple[list[list[int]], set[str]]:
    """Greedy ids of two prompts longer than MAX_ROWS, and the ops that ran."""
    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (70, 45)]
    config = EngineConfig(page_size=4, num_pages=128, compile=compile, compile_in_background=False)
    with LLMEngine("qwen3-tiny", config) as engine, profile(activities=[ProfilerActivity.CPU]) as prof:
        outs = engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    return [list(o.output_ids) for o in outs], {e.key for e in prof.key_averages()}


@needs_onednn
def test_a_compiled_engine_on_onednn_generates_what_it_does_on_mkl_in_one_graph(monkeypatch):
    """auto, with calibration finding oneDNN faster for every shape: the compiled step calls it as
    one opaque op (inductor cannot lower a plain weight's mkldnn linear itself) for the prompts'
    products, with the greedy tokens of the eager engine on MKL (compiled and eager agree:
    test_compiled_step), and without a graph break (asking torch.backends inside the step broke
    it into pieces: 0.6x the tokens/s)."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(wide_gemm, "MODE", "mkl")
    on_mkl, mkl_ops = _greedy_ids(compile=False)
    monkeypatch.setattr(wide_gemm, "MODE", "auto")
    monkeypatch.setattr(wide_gemm, "_onednn_faster", {})
    monkeypatch.setattr(wide_gemm, "best_time_s", lambda fn, x, w, calls: 1.0 if fn is wide_gemm._onednn_linear else 2.0)
    counters.clear()
    on_onednn, onednn_ops = _greedy_ids(compile=True)
    assert "disaggsdk::onednn_linear" in onednn_ops and "disaggsdk::onednn_linear" not in mkl_ops
    assert on_onednn == on_mkl
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_the_timing_helpers_time_each_way_in_rounds_and_pick_float32_cpu_matrices():
    from disaggsdk.engine.modeling.layers.gemm_timing import best_time_s, float32_cpu_weights

    calls = []
    assert best_time_s(lambda x, w: calls.append(1), torch.ones(1), torch.ones(1), calls=4) >= 0
    assert len(calls) == 1 + 3 * 4  # one untimed call, then 3 rounds
    experts = torch.randn(3, 8, 4)
    picked = list(float32_cpu_weights([torch.randn(8, 4), experts, torch.randn(8), torch.randn(8, 4).bfloat16()]))
    assert [tuple(w.shape) for w in picked] == [(8, 4), (8, 4)] and torch.equal(picked[1], experts[0])
