"""What a launch says while it starts (issue 38 item 4): one line per unit and step (loading weights,
compiling, ready) to the launcher's chosen output, and, with ``serve.http.access_log``, one line per
finished request naming the prefill and decode instance that served it."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from disaggsdk.launch import messages as ch
from disaggsdk.launch.progress import progress_line
from disaggsdk.serve.http.access_log import LOGGER_NAME, access_line
from tests.conftest import start_cli_server
from tests.launch._helpers import make_spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_progress_lines_say_the_model_the_size_and_that_the_compile_cache_helps():
    assert progress_line(ch.Progress("decode-0", "loading", model="qwen3-coder-tiny", weight_bytes=27_300_000)) == (
        "decode-0: loading weights (qwen3-coder-tiny, 27.3 MB per rank)")
    compiling = progress_line(ch.Progress("decode-0", "compiling"))
    assert compiling.startswith("decode-0: compiling its step with torch.compile (in the background, serving on the "
                                "eager step meanwhile; minutes on a first start")
    assert "reuse torch's compile cache" in compiling
    assert progress_line(ch.Progress("decode-0", "compiled", elapsed_s=41.25)) == (
        "decode-0: compiled in 41.2 s: runs the compiled step from now on")
    failed = progress_line(ch.Progress("decode-0", "compile_failed", detail="TypeError: BooleanAtom not allowed"))
    assert failed == ("decode-0: its step did not compile (TypeError: BooleanAtom not allowed): it serves on the eager "
                      "step; `$.engine.compile: false` in the spec (or DISAGGSDK_COMPILE=0) skips compiling")


def test_an_access_line_without_generation_has_only_the_http_part():
    assert access_line("10.0.0.1:5000", "GET", "/v1/models", "1.1", 200, 2.25, []) == (
        '10.0.0.1:5000 "GET /v1/models HTTP/1.1" 200 total_ms=2.2')


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_launch_reports_each_unit_on_stdout_and_logs_each_request_with_its_instances(capsys):
    from disaggsdk import Cluster

    cluster = Cluster(make_spec("qwen3-coder-tiny")).serve(access_log=True)
    access = _Lines()
    logging.getLogger(LOGGER_NAME).addHandler(access)  # a handler of the user's: the access log keeps it
    try:
        with cluster.launch(port=0, max_restarts=0) as d:  # progress to stdout: a notebook's output, not an error
            body = {"model": d.model_name, "prompt": "def fib(n):", "max_tokens": 4, "temperature": 0}
            answer = httpx.post(f"{d.url}/v1/completions", json=body, timeout=120).json()
            with httpx.stream("POST", f"{d.url}/v1/completions", json=body | {"stream": True}, timeout=120) as r:
                r.read()
            httpx.get(f"{d.url}/v1/models", timeout=30)
            deadline = time.monotonic() + 10  # a line is written once its response has ended
            while len(access.lines) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(access)
    captured = capsys.readouterr()
    progress = captured.out.splitlines()
    assert "loading" not in captured.err and "ready" not in captured.err
    for unit in ("prefill-0", "decode-0"):
        assert f"{unit}: loading weights (qwen3-coder-tiny, " in "\n".join(progress)
        assert any(re.fullmatch(rf"{unit}: ready after \d+\.\d s", line) for line in progress), progress
    assert progress[-2].startswith("ready: 2 units over shm")
    assert re.fullmatch(r"ready in \d+\.\d s: http://127\.0\.0\.1:\d+/v1  model qwen3-coder-tiny", progress[-1])
    prompt_tokens = answer["usage"]["prompt_tokens"]
    generated = [line for line in access.lines if "/v1/completions" in line]
    assert len(generated) == 2, access.lines
    for line in generated:
        assert re.fullmatch(
            rf'127\.0\.0\.1:\d+ "POST /v1/completions HTTP/1\.1" 200 prompt_tokens={prompt_tokens} output_tokens=4 '
            r"ttft_ms=\d+\.\d total_ms=\d+\.\d prefill=prefill-0 decode=decode-0", line), line
    assert any(re.fullmatch(r'127\.0\.0\.1:\d+ "GET /v1/models HTTP/1\.1" 200 total_ms=\d+\.\d', line)
               for line in access.lines), access.lines


@pytest.mark.slow
def test_a_cli_launch_with_compiling_prints_progress_and_access_lines_on_stdout():
    """The real start: torch.compile on, progress and the ready line on stdout, stderr quiet."""
    lines: list[str] = []
    proc, url = start_cli_server("launch", "--model", "qwen3-coder-tiny", "--device", "cpu", "--port", "0",
                                 "--no-live", "--access-log", timeout_s=600, env={"DISAGGSDK_COMPILE": "1"},
                                 separate_stderr=True, lines=lines)
    try:
        body = {"model": "qwen3-coder-tiny", "prompt": "def fib(n):\n    if n < 2:", "max_tokens": 2}
        httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    text = "".join(lines) + out
    for unit in ("prefill-0", "decode-0"):
        assert f"{unit}: compiling its step with torch.compile" in text
        assert re.search(rf"{unit}: compiled in \d+\.\d s", text)
    assert re.search(r'"POST /v1/completions HTTP/1\.1" 200 .* prefill=prefill-0 decode=decode-0', text), text
    assert "compiling" not in err and "ready" not in err, err


def test_access_log_flag_sets_the_spec_key(run_cli):
    p = run_cli("launch", "--model", "qwen3-coder-tiny", "--device", "cpu", "--access-log", "--print-spec")
    assert p.returncode == 0, p.stderr
    assert "access_log: true" in p.stdout


def test_serve_model_logs_requests_of_its_one_engine():
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    access = _Lines()
    logging.getLogger(LOGGER_NAME).addHandler(access)
    try:
        with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=64), port=0, access_log=True) as d:
            body = {"model": d.model_name, "prompt": "def fib(n):", "max_tokens": 3, "temperature": 0}
            httpx.post(f"{d.url}/v1/completions", json=body, timeout=120)
            httpx.post(f"{d.url}/v1/completions", json=body | {"max_tokens": -1}, timeout=120)  # refused: 400
            deadline = time.monotonic() + 10
            while len(access.lines) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        logging.getLogger(LOGGER_NAME).removeHandler(access)
    assert re.fullmatch(r'127\.0\.0\.1:\d+ "POST /v1/completions HTTP/1\.1" 200 prompt_tokens=\d+ output_tokens=3 '
                        r"ttft_ms=\d+\.\d total_ms=\d+\.\d prefill=- decode=\S+", access.lines[0]), access.lines
    assert re.fullmatch(r'127\.0\.0\.1:\d+ "POST /v1/completions HTTP/1\.1" 400 total_ms=\d+\.\d', access.lines[1])


def test_serve_says_it_loads_before_it_is_ready():
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "disaggsdk.cli.main", "serve", "--model", "qwen3-coder-tiny",
                             "--port", "0", "--no-live"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ready in"):
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert lines[0] == "mixed-0: loading weights (qwen3-coder-tiny)\n", lines
    assert lines[-1].startswith("ready in") and "loading" not in err


def test_the_access_logger_prints_to_stdout_unless_given_a_handler():
    from disaggsdk.serve.http.access_log import access_logger

    logger = logging.getLogger(LOGGER_NAME)
    saved = (logger.handlers[:], logger.propagate, logger.level)
    logger.handlers.clear()
    try:
        handler = access_logger().handlers[0]
        assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout
        assert access_logger().handlers == [handler]  # once: a second app adds no second line
    finally:
        logger.handlers[:], logger.propagate, logger.level = saved[0], saved[1], saved[2]
