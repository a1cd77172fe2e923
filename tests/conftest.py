"""Shared test helpers: the repository root and a runner for the `disaggsdk` CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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
