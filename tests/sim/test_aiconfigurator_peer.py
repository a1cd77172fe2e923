"""AIConfigurator as the peer of `simulate --published`: its output read, its failures named, its recorded
predictions the ones its saved runs give.

aiconfigurator_runs/ holds what ``aiconfigurator`` 0.12.0 printed on 2026-12-07 for the commands
`disaggsdk.sim.published` runs (the long "Loading low-fidelity fallback rows" warnings, which name paths of
that machine, taken out). The CLI is not installed in the project's environment: `predict` is tested with
a stand-in executable that prints those files.
"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import attrs
import pytest

from disaggsdk.sim.aiconfigurator_peer import AicDefault, AicEstimate, parse_default, parse_estimate, predict
from disaggsdk.sim.published import CASES

RUNS = Path(__file__).parent / "aiconfigurator_runs"
FIGURES = {(case.name, figure.metric): figure for case in CASES for figure in case.figures}
QWEN = AicDefault(model_path="Qwen/Qwen3-32B-FP8", system="h200_sxm", backend="trtllm", total_gpus=8, isl=4000,
                  osl=500, ttft_ms=600.0, tpot_ms=16.67)
PREFILL = AicEstimate(model_path="deepseek-ai/DeepSeek-R1", system="h100_sxm", backend="sglang", mode="static_ctx",
                      isl=2000, osl=1, batch_size=8, tp=1, dp=32, etp=1, ep=32)
DECODE_EP64 = AicEstimate(model_path="deepseek-ai/DeepSeek-R1", system="h100_sxm", backend="sglang",
                          mode="static_gen", isl=2000, osl=100, batch_size=256, tp=1, dp=64, etp=1, ep=64)


def run_text(name: str) -> str:
    return (RUNS / name).read_text()


def test_cli_default_gives_the_best_disaggregated_over_the_best_aggregated_tokens_per_gpu():
    ratio, words = parse_default(run_text("qwen_trtllm_ttft600.log"))
    assert ratio == pytest.approx(762.98 / 608.86)
    assert words == "disagg 762.98 over agg 608.86 tok/s per GPU"
    ratio, _ = parse_default(run_text("qwen_trtllm_ttft1200.log"))
    assert ratio == pytest.approx(762.98 / 661.05)


def test_cli_default_with_no_layout_meeting_the_sla_gives_none():
    assert parse_default(run_text("qwen_vllm_ttft600.log")) == (None, "no agg layout met the SLA")
    assert parse_default("nothing it would print") == (None, "no \"agg Top Configurations\" table in its output")


def test_cli_estimate_gives_tokens_per_second_per_node():
    value, words = parse_estimate(run_text("lmsys_prefill_bs8.log"), PREFILL)
    assert value == pytest.approx(63.367 * 2000 / 4)  # seq/s x ISL over the 32 GPUs' 4 nodes
    assert words == "63.367 seq/s x 2000 tokens over 4 nodes, TTFT 4039.93 ms"
    value, words = parse_estimate(run_text("lmsys_decode_ep64_bs256.log"), DECODE_EP64)
    assert value == pytest.approx(2165.39 * 8)
    assert words == "2165.39 tok/s per GPU x 8, TPOT 118.223 ms"
    assert parse_estimate("", PREFILL) == (None, "no seq/s in its estimate")
    assert parse_estimate("", DECODE_EP64) == (None, "no tokens/s/gpu in its estimate")


def test_the_recorded_predictions_are_what_the_saved_runs_give():
    recorded = {key: figure.aiconfigurator_recorded for key, figure in FIGURES.items()}
    lmsys, dynamo = "lmsys-r1-96xh100", "dynamo-qwen3-32b-fp8"
    prefill = recorded[lmsys, "input tokens/s per prefill node"]
    assert prefill is not None and prefill.value == pytest.approx(
        parse_estimate(run_text("lmsys_prefill_bs8.log"), PREFILL)[0], abs=0.1)
    decode = recorded[lmsys, "output tokens/s per decode node"]
    assert decode is not None and decode.value is None and "Cross-node EP requires DeepEP A2A data" in decode.note
    for ttft_ms, log in ((600, "qwen_trtllm_ttft600.log"), (1200, "qwen_trtllm_ttft1200.log")):
        gain = recorded[dynamo, f"tok/s per GPU, disaggregated over aggregated, TTFT <= {ttft_ms} ms"]
        assert gain is not None and gain.value == pytest.approx(parse_default(run_text(log))[0], abs=1e-4)


def test_the_queries_are_the_commands_of_the_saved_runs():
    gain = FIGURES["dynamo-qwen3-32b-fp8", "tok/s per GPU, disaggregated over aggregated, TTFT <= 600 ms"]
    assert gain.aiconfigurator == QWEN
    assert QWEN.argv() == ["cli", "default", "--model-path", "Qwen/Qwen3-32B-FP8", "--total-gpus", "8", "--system",
                           "h200_sxm", "--backend", "trtllm", "--isl", "4000", "--osl", "500", "--ttft", "600",
                           "--tpot", "16.67"]
    assert "Effective parameters: ISL=4000, OSL=500, TTFT=600.0ms, TPOT=16.7ms, backend=trtllm" \
        in run_text("qwen_trtllm_ttft600.log")
    assert FIGURES["lmsys-r1-96xh100", "input tokens/s per prefill node"].aiconfigurator == PREFILL
    assert "Estimating performance (static_ctx) for deepseek-ai/DeepSeek-R1 on h100_sxm (backend=sglang, tp=1, bs=8)" \
        in run_text("lmsys_prefill_bs8.log")
    decode = FIGURES["lmsys-r1-96xh100", "output tokens/s per decode node"].aiconfigurator
    assert decode == attrs.evolve(DECODE_EP64, dp=72, ep=72)


def stand_in(tmp_path: Path, body: str) -> str:
    """An executable that plays ``aiconfigurator``: a Python script with ``body``."""
    path = tmp_path / "aiconfigurator"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_predict_runs_the_command_and_reads_what_it_prints(tmp_path):
    log = RUNS / "qwen_trtllm_ttft600.log"
    exe = stand_in(tmp_path, f"assert sys.argv[1:3] == ['cli', 'default'], sys.argv\nprint(open({str(log)!r}).read())")
    prediction = predict(QWEN, exe)
    assert prediction.value == pytest.approx(762.98 / 608.86)
    assert prediction.note.startswith("`aiconfigurator cli default --model-path Qwen/Qwen3-32B-FP8 ")
    assert prediction.note.endswith("`: disagg 762.98 over agg 608.86 tok/s per GPU")


def test_predict_says_why_it_has_no_value(tmp_path):
    log = RUNS / "lmsys_decode_bs256.log"
    failed = predict(PREFILL, stand_in(tmp_path, f"print(open({str(log)!r}).read())\nsys.exit(1)"))
    assert failed.value is None
    assert "--ep 32` stopped: Cross-node EP requires DeepEP A2A data, but no compatible exact" in failed.note
    slow = predict(PREFILL, stand_in(tmp_path, "time.sleep(30)"), timeout_s=0.5)
    assert slow.value is None and slow.note.endswith("did not finish in 0.5 s")
    absent = predict(PREFILL, str(tmp_path / "no-such-command"))
    assert absent.value is None and "could not start" in absent.note
