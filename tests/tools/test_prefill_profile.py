"""`tools/peers/prefill_profile.py`: self times from a profiler trace, split by kind of kernel; and one
real run of our side on a tiny random Qwen3 directory (vLLM's side needs the peer venv)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tools.peers.prefill_profile import kind_of, self_times_ms, split


def _op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_self_time_is_an_events_duration_less_its_direct_childrens():
    """A compiled graph's call (10 ms) holds two GEMMs (3 + 2 ms, one of them calling a copy of
    1 ms) and the attention op (4 ms); another thread's event does not nest under it."""
    events = [
        {**_op("## Call CompiledFxGraph abc ##", 0, 10_000), "cat": "user_annotation"},
        _op("aten::mm", 100, 3_000), _op("aten::copy_", 200, 1_000),
        _op("aten::addmm", 3_500, 2_000), _op("disaggsdk::attention", 6_000, 4_000),
        _op("aten::mm", 0, 5_000, tid=2),
        {"ph": "i", "name": "an instant event", "ts": 50},
    ]
    ms = self_times_ms(events)
    assert ms == {"## Call CompiledFxGraph abc ##": 1.0, "aten::mm": 2.0 + 5.0, "aten::copy_": 1.0,
                  "aten::addmm": 2.0, "disaggsdk::attention": 4.0}
    row = split(ms, prefills=1, wall_ms=15.0)
    assert row["ms"] == {"gemm": 9.0, "attention": 4.0, "fused_elementwise": 1.0, "other_ops": 1.0, "outside_ops": 0.0}
    assert row["kernels"] == {"gemm": {"aten::mm": 7.0, "aten::addmm": 2.0}, "attention": {"disaggsdk::attention": 4.0}}


def test_every_kind_names_vllms_ops_too():
    assert kind_of("_C::onednn_mm") == "gemm" and kind_of("_C::cpu_attention_with_kv_cache") == "attention"
    assert kind_of("_C::cpu_attn_reshape_and_cache") == "kv_write" and kind_of("_C::greedy_argmax") == "other_ops"
    assert kind_of("execute_context_1(1024)_generation_0(0)") is None  # a step annotation: only its ops count


def test_our_side_profiles_a_real_prefill(tmp_path):
    """16-dim heads (hidden 128 / 8 heads): the native prefill kernel runs."""
    pytest.importorskip("torch")
    model = tmp_path / "m"
    subprocess.run([sys.executable, "tools/peers/make_model.py", str(model), "--layers", "1", "--hidden", "128"],
                   cwd=ROOT, check=True, capture_output=True)
    p = subprocess.run([sys.executable, "tools/peers/prefill_profile.py", "ours", str(model), "--tokens", "256",
                        "--rounds", "2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    row = json.loads(p.stdout.strip().splitlines()[-1])
    assert row["who"] == "ours" and row["tokens"] == 256 and row["prefill_ms"]["median"] > 0
    assert row["ms"]["gemm"] > 0 and row["ms"]["attention"] > 0
    assert set(row["kernels"]["attention"]) == {"disaggsdk::attention"}
    assert sum(row["share"].values()) >= 0.98  # ops under the profiler can take longer than the unprofiled wall
