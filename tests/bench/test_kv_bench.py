"""`disaggsdk kv-bench`: both modes run and report; streaming sends before the forward ends, the
ablation only after it. (Timings are printed, not asserted: this machine is shared.)"""

from __future__ import annotations

import json

import pytest

from disaggsdk.bench.kv_bench import summarize
from disaggsdk.report.request_transfer import RequestTransfer


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
