"""Shared test helpers: the repository root and a runner for the `disaggsdk` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.declared_skips import DECLARED_PREFIXES, is_declared

ROOT = Path(__file__).resolve().parent.parent

# The suite runs engines eagerly unless a test asks for the compiled step (EngineConfig(compile=True),
# a spec's engine.compile: true): compiling costs seconds per engine and process, and the suite
# builds hundreds of them. The units and CLIs the tests start inherit this.
os.environ.setdefault("DISAGGSDK_COMPILE", "0")
# Decode matmuls take one fixed form (engine.modeling.layers.skinny) rather than the one a timing in
# each process picks: every engine of a test, in any process, computes the same float32 numbers.
# Prefill's products likewise stay on one library (engine.modeling.layers.wide_gemm).
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


ALLOW_SKIPS_ENV = "DISAGGSDK_ALLOW_SKIPS"  # "1": report undeclared skips without failing the run


class SkipGuard:
    """No silent skips. A skip for any reason but the declared ones (`tests/declared_skips.py`: no
    GPU, no RDMA device, not root, a CPU or kernel feature) fails the run: `make test` installs
    everything else the suite needs, so such a skip is a broken install (an extra missing, a native
    kernel that did not build). Every skip reason is printed, counted, in the run's last lines."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def undeclared(self) -> list[str]:
        """The run's skip reasons that `tests/declared_skips.py` does not declare."""
        return [reason for reason in self.reasons if not is_declared(reason)]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):  # an xfail is not a skip
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
            self.reasons.append(reason.removeprefix("Skipped: "))

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.undeclared() and exitstatus == pytest.ExitCode.OK and os.environ.get(ALLOW_SKIPS_ENV) != "1":
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.reasons:
            return
        undeclared = self.undeclared()
        terminalreporter.section(f"{len(self.reasons)} skipped, {len(undeclared)} for undeclared reasons")
        for reason, count in sorted(Counter(self.reasons).items(), key=lambda item: (is_declared(item[0]), -item[1])):
            terminalreporter.write_line(f"{count:5d} {'' if is_declared(reason) else 'UNDECLARED '}{reason}")
        if undeclared:
            verdict = (f"allowed by {ALLOW_SKIPS_ENV}=1" if os.environ.get(ALLOW_SKIPS_ENV) == "1"
                       else "the run fails: a missing package or a native build that failed is a broken install "
                            "(`make install`, or fix the build)")
            declared = ", ".join(repr(prefix.strip(" :")) for prefix in DECLARED_PREFIXES)
            terminalreporter.write_line(f"{len(undeclared)} skipped for a reason other than {declared} "
                                        f"(tests/declared_skips.py): {verdict}")


def pytest_configure(config):
    config.pluginmanager.register(SkipGuard(), "disaggsdk-skip-guard")


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
