"""The decode-matmul benchmark runs and reports both ways for every shape (no timings asserted)."""

import pytest

pytest.importorskip("torch")

from disaggsdk.bench.skinny_gemm import SHAPES, run_skinny_gemm


def test_skinny_gemm_reports_every_shape_and_row_count():
    result = run_skinny_gemm([1, 2], repeats=2)
    assert len(result["results"]) == 2 * len(SHAPES)
    row = result["results"][0]
    assert row["f_linear_us"] > 0 and row["skinny_us"] > 0 and row["speedup"] > 0
    assert row["skinny_weight_gb_per_s"] > 0


def test_skinny_gemm_in_bfloat16_reads_two_bytes_a_weight():
    result = run_skinny_gemm([2], repeats=2, dtype="bfloat16")
    assert result["dtype"] == "bfloat16" and len(result["results"]) == len(SHAPES)
    row = result["results"][0]
    # the bandwidth figure is the weight's bytes (2 each) over the time taken
    out_features, in_features = row["weight"]
    expected = out_features * in_features * 2 / 1e9 / (row["f_linear_us"] * 1e-6)
    assert row["f_linear_weight_gb_per_s"] == pytest.approx(expected, rel=0.05, abs=0.1)
    from disaggsdk.engine.modeling.layers import amx_linear

    assert result["amx"] == amx_linear.available()  # where AMX runs, skinny_us is the packed kernel's
