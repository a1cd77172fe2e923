"""What every command shares: --version, --log-level, one name per concept (old spellings as hidden
aliases), defaults and exit codes in --help, exit 2 without a traceback for a bad spec."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
from importlib.metadata import version

import pytest

from disaggsdk.cli.main import build_parser, main
from disaggsdk.cli.options import EXIT_CODES_EPILOG, set_log_level


@pytest.fixture
def restore_logger():
    logger = logging.getLogger("disaggsdk")
    level, handlers = logger.level, list(logger.handlers)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers


def test_version_is_the_installed_packages(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"disaggsdk {version('disaggsdk')}"


def test_log_level_before_or_after_the_command_sets_the_package_logger(restore_logger, tmp_path):
    parser = build_parser()
    assert parser.parse_args(["validate", "x.yaml"]).log_level == "warning"
    assert parser.parse_args(["--log-level", "DEBUG", "validate", "x.yaml"]).log_level == "debug"
    assert parser.parse_args(["--log-level", "error", "validate", "x.yaml", "--log-level", "info"]).log_level == "info"
    spec = tmp_path / "s.yaml"
    spec.write_text("model: qwen3-tiny\ndevice: cpu\nhardware: {gpu: cpu}\n")
    assert main(["--log-level", "info", "validate", str(spec)]) == 0
    assert restore_logger.level == logging.INFO and restore_logger.handlers
    assert set_log_level("error").getEffectiveLevel() == logging.ERROR
    assert len(restore_logger.handlers) == 1  # set again: no second handler
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--log-level", "loud", "validate", "x.yaml"])
    assert exc.value.code == 2


def test_log_level_shows_package_messages_below_warning():
    # a fresh process: Python's last-resort handler alone would drop a DEBUG message
    code = ("import logging; from disaggsdk.cli.options import set_log_level; set_log_level('debug'); "
            "logging.getLogger('disaggsdk.engine.x').debug('hello')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "DEBUG disaggsdk.engine.x: hello" in p.stderr


# (command line with the old spelling, the same with the one name, the attribute both set)
ALIASES = [
    (["bench", "http://h:1", "--qps", "3"], ["bench", "http://h:1", "--request-rate", "3"], "request_rate"),
    (["bench", "http://h:1", "--random-input-len", "9"], ["bench", "http://h:1", "--input-len", "9"], "input_len"),
    (["bench", "http://h:1", "--random-output-len", "9"], ["bench", "http://h:1", "--output-len", "9"], "output_len"),
    (["bench", "http://h:1", "--random-range-ratio", "0.5"], ["bench", "http://h:1", "--range-ratio", "0.5"],
     "range_ratio"),
    (["bench", "http://h:1", "--dataset", "f.json"], ["bench", "http://h:1", "--dataset-path", "f.json"],
     "dataset_path"),
    (["generate", "--max-tokens", "7"], ["generate", "--output-len", "7"], "output_len"),
    (["kv-bench", "s.yaml", "--prompt-len", "64"], ["kv-bench", "s.yaml", "--input-len", "64"], "input_len"),
    (["kv-bench", "s.yaml", "--requests", "2"], ["kv-bench", "s.yaml", "--num-prompts", "2"], "num_prompts"),
    (["plan", "s.yaml", "--tokens", "33"], ["plan", "s.yaml", "--input-len", "33"], "input_len"),
    (["simulate", "s.yaml", "--qps", "1,2"], ["simulate", "s.yaml", "--request-rate", "1,2"], "request_rate"),
    (["tune", "m", "--gpus", "8", "--slo", "x", "--qps", "2"], ["tune", "m", "--gpus", "8", "--slo", "x",
                                                                 "--request-rate", "2"], "request_rate"),
    (["tune", "m", "--gpus", "8", "--slo", "x", "--out", "b.yaml"], ["tune", "m", "--gpus", "8", "--slo", "x",
                                                                      "--output", "b.yaml"], "output"),
    (["calibrate", "--out", "p.yaml"], ["calibrate", "--output", "p.yaml"], "output"),
]


@pytest.mark.parametrize("old, new, dest", ALIASES, ids=[" ".join(a[0][:1] + a[0][-2:-1]) for a in ALIASES])
def test_old_spellings_parse_like_the_one_name(old, new, dest):
    parser = build_parser()
    a, b = vars(parser.parse_args(old)), vars(parser.parse_args(new))
    a.pop("run"), b.pop("run")
    assert a == b and dest in a


def test_vllm_goodput_and_backend_mean_what_our_slo_and_endpoint_do():
    from disaggsdk.cli import bench_args

    parse = build_parser().parse_args
    vllm = parse(["bench", "--base-url", "http://h:1", "--goodput", "ttft:5", "e2el:9", "--backend", "openai-chat"])
    ours = parse(["bench", "http://h:1", "--slo", "ttft=5,e2el=9", "--endpoint", "/v1/chat/completions"])
    assert bench_args.slos_ms(vllm) == bench_args.slos_ms(ours) == {"ttft": 5.0, "e2el": 9.0}
    assert bench_args.endpoint(vllm) == bench_args.endpoint(ours) == "/v1/chat/completions"


def test_aliases_do_not_overwrite_the_defaults():
    from disaggsdk.cli import bench_args

    args = build_parser().parse_args(["bench", "http://h:1"])
    assert bench_args.request_rates(args) == (math.inf,) and args.input_len == 256 and args.dataset_path is None
    assert build_parser().parse_args(["generate"]).output_len == 16


@pytest.mark.parametrize("command", ["bench", "launch", "simulate", "tune", "generate", "kv-bench", "plan"])
def test_help_shows_defaults_and_exit_codes_and_hides_old_spellings(command, run_cli, monkeypatch):
    monkeypatch.setenv("DISAGGSDK_API_KEY", "sk-secret-123")
    p = run_cli(command, "--help")
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())  # argparse wraps lines
    assert "(default: " in text and EXIT_CODES_EPILOG.splitlines()[0] in p.stdout
    assert "2 bad input" in text and "130 interrupted" in text
    assert "sk-secret-123" not in p.stdout  # an API key from the environment is not printed
    for old in ("--max-tokens", "--prompt-len", "--tokens ", "--out "):
        assert old not in p.stdout


def test_bench_help_lists_vllm_spellings_with_defaults(run_cli):
    text = " ".join(run_cli("bench", "--help").stdout.split())
    for flag in ("--request-rate RATE|R,R,...|search, --qps", "--goodput KEY:MS", "--goodput-target SHARE",
                 "--search-steps SEARCH_STEPS", "--save-result", "--result-dir",
                 "--result-filename", "--percentile-metrics", "--metric-percentiles", "--endpoint",
                 "--max-concurrency", "--temperature", "--random-input-len", "--random-output-len",
                 "--random-range-ratio", "--dataset-name", "--dataset-path"):
        assert flag in text, flag
    assert "(default: inf)" in text and "(default: ttft,tpot,itl,e2el)" in text


def test_top_level_help_documents_exit_codes(run_cli):
    p = run_cli("--help")
    assert p.returncode == 0 and "exit codes:" in p.stdout and "--version" in p.stdout and "--log-level" in p.stdout


def test_a_bad_spec_exits_2_with_a_message_and_no_traceback(run_cli, tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("model: qwen3-coder\ndecode: {tp: eight}\n")
    for argv in (["validate", str(spec)], ["plan", str(spec)], ["--log-level", "debug", "simulate", str(spec)]):
        p = run_cli(*argv)
        assert p.returncode == 2, (argv, p.stderr)
        assert "$.decode.tp" in p.stderr and "Traceback" not in p.stderr + p.stdout


def test_tune_needs_a_model_and_a_rate_with_a_message(run_cli):
    p = run_cli("tune", "--gpus", "8", "--slo", "ttft_p90_ms=1000", "--request-rate", "1")
    assert p.returncode == 2 and "give the model" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("tune", "--model", "qwen3-coder", "--gpus", "8", "--slo", "ttft_p90_ms=1000")
    assert p.returncode == 2 and "--request-rate" in p.stderr and "Traceback" not in p.stderr


def test_version_verbose_names_the_cpu_and_the_kernels(capsys):
    from disaggsdk.cli.version_info import wants_verbose_version
    from disaggsdk.records.host_cpu import host_cpu

    assert main(["--version", "-v"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"disaggsdk {version('disaggsdk')}"
    assert f"cpu: {host_cpu().line()}" in out
    assert any(line.startswith("torch ") and "ATen CPU kernels at" in line for line in out)
    assert any(line.startswith("bfloat16 decode linear: ") for line in out)
    assert "float32 prefill linear: MKL (F.linear), fixed by DISAGGSDK_WIDE_GEMM=mkl" in out  # the suite's mode
    assert "attention: decode and prefill by the native kernels (cpu backend)" in out
    assert wants_verbose_version(["--verbose", "--version"]) and not wants_verbose_version(["--version"])
    assert not wants_verbose_version(["-v", "--version", "plan"])  # a command's -v is the command's


def test_launch_bench_refuses_a_sweep_before_it_starts_anything(run_cli):
    p = run_cli("launch", "specs/tiny_pd.yaml", "--bench", "--request-rate", "1,2", "--goodput", "ttft:500")
    assert p.returncode == 2 and "`disaggsdk bench` runs sweeps" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "starting" not in p.stdout + p.stderr  # refused before the launch
