"""`disaggsdk kv-bench`: both modes run and report; streaming sends before the forward ends, the
ablation only after it. (Timings are printed, not asserted: this machine is shared.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disaggsdk.bench.kv_bench import summarize
from disaggsdk.records.request_transfer import RequestTransfer


def test_summarize_is_pure_arithmetic():
    decode = [RequestTransfer(f"r{i}", "decode", 10, exposed_s=e) for i, e in enumerate((0.001, 0.003, 0.002))]
    prefill = [RequestTransfer("r0", "prefill", 10, bytes=100, writes=4, transfer_s=0.01, lead_s=-0.002)]
    s = summarize(decode, prefill)
    assert s["requests"] == 3 and s["mean_exposed_ms"] == pytest.approx(2.0)
    assert s["median_exposed_ms"] == pytest.approx(2.0)
    assert s["p99_exposed_ms"] == pytest.approx(3.0) and s["bytes_per_request"] == 100
    assert s["mean_lead_ms"] == pytest.approx(-2.0)


def test_kv_bench_cli_reports_both_modes(run_cli, tmp_path):
    pytest.importorskip("torch")
    from disaggsdk.spec import save_spec
    from tests.launch._helpers import make_spec

    spec_path = tmp_path / "one_by_one.yaml"  # one prefill and one decode unit: two processes per mode
    save_spec(make_spec("qwen3-coder-tiny", page_size=16), spec_path)
    proc = run_cli("kv-bench", str(spec_path), "--prompt-len", "64", "--requests", "2", timeout_s=240)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    s, a = result["streaming"], result["ablation"]
    assert s["requests"] == a["requests"] == 2
    assert s["writes_per_request"] == a["writes_per_request"] == 4 * 4 + 1  # 4 pages x 4 layers + context
    assert s["mean_lead_ms"] > 0 >= a["mean_lead_ms"]  # streamed during the forward vs. after it
    assert result["exposed_ratio"] is not None


def test_kv_bytes_per_token_leave_the_context_payload_out():
    prefill = [RequestTransfer("r0", "prefill", 10, bytes=1000 + 64), RequestTransfer("r1", "prefill", 20, bytes=2000 + 64)]
    assert summarize([], prefill, context_bytes=64)["kv_bytes_per_token"] == pytest.approx(100.0)


@pytest.mark.slow  # two deployments, ~45 s; the default run keeps test_fp8_and_bfloat16_page_formats_...
def test_fp8_pages_travel_in_half_the_bytes_of_bfloat16():
    """The messenger moves page bytes as they are: one request through a prefill and a decode unit
    sends, per token of KV, half as many bytes with `kv.dtype: fp8` as with bfloat16 (bytes
    counted by the prefill unit, not timed)."""
    pytest.importorskip("torch")
    import attrs

    from disaggsdk.bench.kv_bench import run_mode
    from disaggsdk.engine.modeling import kv_geometry
    from disaggsdk.engine.parallel import TensorParallel
    from disaggsdk.models import resolve_model
    from tests.launch._helpers import make_spec

    spec = make_spec("qwen3-coder-tiny", page_size=16)
    sent = {}
    for dtype in ("bfloat16", "fp8"):
        result = run_mode(attrs.evolve(spec, kv=attrs.evolve(spec.kv, dtype=dtype)), True, 64, 1)
        sent[dtype] = result["kv_bytes_per_token"]
        assert result["requests"] == 1
    assert sent["fp8"] * 2 == sent["bfloat16"]
    # the 64-token prompt's 4 pages of 16; each token of a page carries K and V of every layer:
    # 2 x heads x head_dim elements of 1 byte
    geometry = kv_geometry(resolve_model("qwen3-coder-tiny"), TensorParallel(0, 1))
    assert sent["fp8"] == geometry.num_layers * 2 * geometry.num_kv_heads_local * geometry.head_dim


def test_fp8_and_bfloat16_page_formats_differ_only_in_bytes_per_element():
    """What the transfer plan moves per page (`KVPageFormat.page_bytes`): fp8 half of bfloat16's."""
    pytest.importorskip("torch")
    from disaggsdk.kv.layout import KVPageFormat, kv_dtype_name

    fmts = {d: KVPageFormat(4, 8, 16, num_kv_heads_local=2, head_dim=32, dtype_name=kv_dtype_name(d))
            for d in ("bfloat16", "fp8")}
    assert fmts["fp8"].dtype_name == "float8_e4m3fn" and fmts["fp8"].elem_bytes == 1
    assert 2 * fmts["fp8"].page_bytes == fmts["bfloat16"].page_bytes == 2 * 2 * 16 * 32 * 2


def test_kv_dtype_overrides_the_spec_after_tiny():
    """``--kv-dtype`` sets `kv.dtype` last: over a GPU spec's own and over --tiny's float32."""
    from disaggsdk.cli.kv_bench_cmd import bench_spec
    from disaggsdk.cli.main import build_parser

    parse = build_parser().parse_args
    r1_tp = str(Path(__file__).resolve().parents[2] / "specs" / "r1_tp.yaml")
    assert bench_spec(parse(["kv-bench", r1_tp, "--tiny", "--kv-dtype", "fp8"])).kv.dtype == "fp8"
    assert bench_spec(parse(["kv-bench", r1_tp, "--tiny"])).kv.dtype == "float32"
    with pytest.raises(SystemExit):
        parse(["kv-bench", r1_tp, "--kv-dtype", "int8"])
