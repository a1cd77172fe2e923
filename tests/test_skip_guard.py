"""The conftest's skip guard: a skip for an undeclared reason fails the run, a declared one does not,
and the run's last lines count every skip with its reason (tests/declared_skips.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ALLOW_SKIPS_ENV, ROOT
from tests.declared_skips import DECLARED_PREFIXES, cpu_lacks, is_declared, kernel_variant, no_gpu, not_root


def run_pytest(tmp_path: Path, body: str, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest on one test file holding ``body``, with this suite's conftest as a plugin."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_sample.py").write_text(body)
    environ = {key: value for key, value in os.environ.items() if key != ALLOW_SKIPS_ENV}
    environ.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                           "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=environ)


def test_each_helper_makes_a_declared_reason_and_nothing_else_is():
    for reason in (no_gpu("x"), not_root("x"), cpu_lacks("AMX", "x"), kernel_variant("has sch_netem")):
        assert is_declared(reason) and is_declared(f"Skipped: {reason}")
    for reason in ("CPU attention kernel not built", "could not import 'ray': No module named 'ray'",
                   "chromium is not installed", "needs an NVIDIA GPU"):
        assert not is_declared(reason)
    assert len(DECLARED_PREFIXES) == 6


def test_a_skip_for_a_missing_build_fails_the_run_and_says_why(tmp_path):
    done = run_pytest(tmp_path, """
import pytest

def test_kernel():
    pytest.skip("CPU attention kernel not built")

def test_missing_package():
    pytest.importorskip("disaggsdk_no_such_module")

def test_passes():
    pass
""")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout
    lines = done.stdout.splitlines()
    assert "1 passed, 2 skipped" in lines[-1]
    summary = "\n".join(lines[-6:])
    assert "2 skipped, 2 for undeclared reasons" in done.stdout
    assert "UNDECLARED CPU attention kernel not built" in summary
    assert "UNDECLARED could not import 'disaggsdk_no_such_module'" in summary
    assert "the run fails" in summary


def test_declared_skips_pass_and_are_counted_with_their_reasons(tmp_path):
    done = run_pytest(tmp_path, f"""
import pytest

@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.skipif(True, reason={no_gpu("needs an NVIDIA GPU")!r})
def test_gpu(n):
    pass

def test_netns():
    pytest.skip({not_root("the testbed makes network namespaces")!r})

@pytest.mark.xfail(reason="an expected failure is not a skip")
def test_xfail():
    assert False
""")
    assert done.returncode == pytest.ExitCode.OK, done.stdout
    assert "3 skipped, 0 for undeclared reasons" in done.stdout
    assert "    2 no GPU: needs an NVIDIA GPU" in done.stdout
    assert "    1 not root: the testbed makes network namespaces" in done.stdout
    assert "UNDECLARED" not in done.stdout


def test_the_escape_hatch_reports_but_passes(tmp_path):
    done = run_pytest(tmp_path, "import pytest\n\ndef test_x():\n    pytest.skip('shellcheck is not installed')\n",
                      **{ALLOW_SKIPS_ENV: "1"})
    assert done.returncode == pytest.ExitCode.OK, done.stdout
    assert "UNDECLARED shellcheck is not installed" in done.stdout and f"allowed by {ALLOW_SKIPS_ENV}=1" in done.stdout
