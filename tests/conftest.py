"""Shared test helpers: the repository root and a runner for the `disaggsdk` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The suite runs engines eagerly unless a test asks for the compiled step (EngineConfig(compile=True),
# a spec's engine.compile: true): compiling costs seconds per engine and process, and the suite
# builds hundreds of them. The units and CLIs the tests start inherit this.
os.environ.setdefault("DISAGGSDK_COMPILE", "0")
# Decode matmuls take one fixed form (engine.models.layers.skinny) rather than the one a timing in
# each process picks: every engine of a test, in any process, computes the same float32 numbers.
# Prefill's products likewise stay on one library (engine.models.layers.wide_gemm).
os.environ.setdefault("DISAGGSDK_SKINNY", "on")
os.environ.setdefault("DISAGGSDK_WIDE_GEMM", "mkl")
# Nothing here reaches the network: a wrong checkpoint path must fail at once, not after
# huggingface_hub's retries to a hub it cannot reach.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_collection_modifyitems(config, items):
    """Leave out the tests marked slow (bigger cases of what the default run covers) unless the run
    names them: a marker expression (`make test-all` passes ``-m "slow or not slow"``) or a test's
    node id (``pytest tests/x.py::test_y`` runs it, slow or not)."""
    if config.option.markexpr or any("::" in arg for arg in config.args):
        return
    kept, slow = [], []
    for item in items:
        (slow if item.get_closest_marker("slow") else kept).append(item)
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = kept


@pytest.fixture
def run_cli():
    """Run ``disaggsdk ARGS`` as a real process; returns the CompletedProcess."""

    def run(*args: str, timeout_s: float = 120, **kwargs) -> subprocess.CompletedProcess:
        env = {**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}
        return subprocess.run(
            [sys.executable, "-m", "disaggsdk.cli.main", *args],
            capture_output=True, text=True, timeout=timeout_s, cwd=ROOT, env=env, **kwargs,
        )

    return run


def start_cli_server(*args: str, timeout_s: float = 120, env: dict[str, str] | None = None,
                     separate_stderr: bool = False, lines: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """``disaggsdk ARGS`` as a process that serves; returns it and its base URL once it says it is ready.

    ``env`` adds variables; ``separate_stderr`` keeps stderr apart (``proc.stderr``) for a test of what lands
    on which stream; ``lines`` receives what it printed up to the ready line.

    Raises:
        AssertionError: it printed no URL in time (the process is killed; its output is the message).
    """
    import re
    import time

    proc = subprocess.Popen([sys.executable, "-m", "disaggsdk.cli.main", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE if separate_stderr else subprocess.STDOUT,
                            text=True)
    lines = [] if lines is None else lines
    url = None
    deadline = time.monotonic() + timeout_s
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(r"ready in .*(http://127\.0\.0\.1:\d+)/v1", line)
        url = found.group(1) if found else None
    if url is None:
        proc.kill()
        proc.wait()
        raise AssertionError("".join(lines))
    return proc, url
