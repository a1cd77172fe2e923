"""The one-GPU check (tools/gpu_check.sh, tools/gpu_check.py) on this machine: without a GPU it says so in one
JSON and exits 2 at once; its pytest report reading counts a skip only for missing hardware; its summary passes
only when every part did; its deployment step runs the CPU twin of the GPU deployment to equal tokens (slow)
and stops what it started when a unit cannot run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import attrs
import pytest

from tests.conftest import ROOT
from tests.declared_skips import gpu_present
from tools.gpu_check import (
    compare_tokens,
    deploy,
    environment,
    gpu_test_results,
    spec_in_dtype,
    summary,
    unfinished_gpu_test_results,
)

SCRIPT = ROOT / "tools" / "gpu_check.sh"


def this_machine_has_a_gpu() -> bool:
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        return listed.returncode == 0 and "GPU " in listed.stdout
    return os.path.exists("/dev/nvidia0")


needs_no_gpu = pytest.mark.skipif(this_machine_has_a_gpu(), reason=gpu_present("the check would run"))


@needs_no_gpu
def test_without_a_gpu_the_script_prints_one_json_and_exits_2():
    # the subprocess timeout is the promise: a machine without a GPU hears so well inside a minute
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 2, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    document = json.loads(lines[0])
    assert document["ok"] is False and document["reason"] == "no CUDA GPU"


def test_the_script_parses_and_passes_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (make sysdeps installs it)")
    linted = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
    assert linted.returncode == 0, linted.stdout


GPU_TESTS = '''
import pytest

def test_runs():
    pass

def test_breaks():
    assert 1 == 2

@pytest.mark.skipif(True, reason="needs 2 GPUs: NCCL will not put two ranks on one")
def test_wants_two_gpus():
    pass

def test_wants_a_package():
    pytest.skip("needs CUDA and flashinfer-python")
'''


def junit_of(tmp_path, source: str):
    """The junit report of a real pytest run of ``source`` (its ``-v`` output beside it, ``report.log``)."""
    (tmp_path / "test_gpu_like.py").write_text(source)
    report = tmp_path / "report.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", f"--junitxml={report}",
                           "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path / "test_gpu_like.py")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    (tmp_path / "report.log").write_text(done.stdout)
    return report


def test_a_report_passes_only_without_failures_and_with_skips_for_missing_hardware_only(tmp_path):
    results = gpu_test_results(junit_of(tmp_path, GPU_TESTS))
    outcomes = {test_id.split("::")[1]: r["outcome"] for test_id, r in results["tests"].items()}
    assert outcomes == {"test_runs": "passed", "test_breaks": "failed", "test_wants_two_gpus": "skipped",
                        "test_wants_a_package": "skipped"}
    assert (results["passed"], results["failed"], results["skipped"], results["skipped_for_hardware"]) == (1, 1, 2, 1)
    assert results["ok"] is False
    assert "flashinfer-python" in results["tests"][next(t for t in results["tests"] if "package" in t)]["reason"]

    # a run stopped before its report: the same outcomes from its -v lines, and never ok
    unfinished = unfinished_gpu_test_results(tmp_path / "report.log")
    assert {k.split("::")[1]: v["outcome"] for k, v in unfinished["tests"].items()} == outcomes
    assert unfinished["skipped_for_hardware"] == 1 and unfinished["ok"] is False and "no report" in unfinished["error"]

    only_hardware = GPU_TESTS.replace("assert 1 == 2", "pass").replace('pytest.skip("needs CUDA and flashinfer-python")',
                                                                          "pass")
    assert gpu_test_results(junit_of(tmp_path, only_hardware))["ok"] is True


def test_a_skip_for_a_missing_package_or_no_test_at_all_does_not_pass(tmp_path):
    assert gpu_test_results(junit_of(tmp_path, GPU_TESTS.replace("assert 1 == 2", "pass")))["ok"] is False
    assert gpu_test_results(junit_of(tmp_path, "X = 1\n"))["ok"] is False  # collected nothing


def test_the_summary_passes_only_when_the_tests_and_every_deployment_did():
    env = {"gpu_name": "NVIDIA H100 80GB HBM3", "driver": "570.1", "torch": "2.9.0"}
    passed_tests = {"ok": True, "passed": 3}
    exact = {"ok": True, "compare": "exact", "dtype": None, "tokens_equal": True, "ttft_s": 0.05}
    first_token = {"ok": True, "compare": "first-token", "dtype": "bfloat16", "tokens_equal": False, "ttft_s": 0.04}
    document = summary(env, passed_tests, [exact, first_token], 123.4, "/tmp/logs", ["flashinfer-python: installed"])
    assert document["ok"] is True and "reason" not in document
    # tokens_equal speaks for the exact (float32) deployments; the bfloat16 one passes on its first tokens
    assert (document["gpu_name"], document["tokens_equal"], document["ttft_s"]) == ("NVIDIA H100 80GB HBM3", True, 0.05)
    assert document["gpu_tests"] == passed_tests and document["notes"] == ["flashinfer-python: installed"]
    unequal = summary(env, passed_tests, [{**exact, "ok": False, "tokens_equal": False}, first_token], 1.0)
    assert unequal["ok"] is False and unequal["tokens_equal"] is False
    assert unequal["reason"] == "the deployment in the spec's dtype did not pass"
    both = summary(env, {"ok": False, "error": "no pytest report"}, [exact, {**first_token, "ok": False}], 1.0)
    assert both["reason"] == "gpu tests and the deployment in bfloat16 did not pass"
    assert summary(env, passed_tests, [], 1.0)["ok"] is False


def test_tokens_compare_exactly_or_by_their_first_token():
    cpu = [[5, 6, 7, 8], [9, 10, 11, 12]]
    parted = [[5, 6, 1, 2], [9, 10, 11, 12]]  # the first prompt parts from the CPU's at its third token
    assert compare_tokens(cpu, cpu, 4, "exact")["ok"] is True
    exact = compare_tokens(parted, cpu, 4, "exact")
    assert exact["ok"] is False and exact["first_tokens_equal"] is True and exact["common_prefix_tokens"] == [2, 4]
    assert compare_tokens(parted, cpu, 4, "first-token")["ok"] is True
    assert compare_tokens([[4, 6, 7, 8], cpu[1]], cpu, 4, "first-token")["ok"] is False
    assert compare_tokens([[5, 6, 7], cpu[1]], cpu, 4, "first-token")["ok"] is False  # a short completion
    assert compare_tokens([[], []], [[], []], 0, "first-token")["ok"] is False  # no first token to compare
    with pytest.raises(ValueError, match="exact or first-token"):
        compare_tokens(cpu, cpu, 4, "close")


def test_a_spec_in_another_dtype_changes_the_weights_and_the_kv_and_nothing_else(tmp_path):
    from disaggsdk.spec import load_spec

    original = load_spec(ROOT / "specs" / "tiny_pd_cuda.yaml")
    changed = load_spec(spec_in_dtype(ROOT / "specs" / "tiny_pd_cuda.yaml", "bfloat16", tmp_path))
    assert (changed.engine.dtype, changed.kv.dtype) == ("bfloat16", "bfloat16")
    assert changed.launch.cuda_devices == original.launch.cuda_devices == (0, 0)
    assert attrs.evolve(changed, engine=original.engine, kv=original.kv) == original


@needs_no_gpu
def test_the_environment_names_this_machines_torch_and_no_gpu():
    from importlib.metadata import version

    found = environment()
    # the installed distribution's version: "2.13.0+cpu" for a CPU wheel, "2.13.0" for PyPI's CUDA build
    # (whose torch.__version__ says "2.13.0+cu130")
    assert found["torch"] == version("torch") and found["torch_sees_cuda"] is False
    assert found["gpu_name"] is None and found["gpu_count"] == 0


@needs_no_gpu
def test_a_deployment_whose_units_cannot_run_fails_with_their_reason_and_leaves_nothing(tmp_path):
    result = deploy(ROOT / "specs" / "tiny_pd_cuda.yaml", ["def f():"], 4, tmp_path / "logs", timeout_s=120)
    assert result["ok"] is False and result["tokens_equal"] is False
    assert "CUDA" in result["error"]  # the unit (or the launcher before it) says the machine has none
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path) not in ps  # the launch ran with --log-dir under tmp_path: none of it is left


@pytest.mark.slow
def test_the_deployment_step_on_cpu_gives_the_cpu_engines_tokens(tmp_path):
    """The same step on the CPU twin of the check's spec: two units, KV over shm, tokens equal to `generate`'s."""
    result = deploy(ROOT / "specs" / "tiny_pd.yaml", ["def fib(n):", "class Stack:"], 6, tmp_path / "logs",
                    timeout_s=300)
    assert result.get("error") is None and result["ok"] is True and result["tokens_equal"] is True
    assert [len(t) for t in result["deployment_tokens"]] == [6, 6]
    assert all(t is not None and t > 0 for t in result["ttft_s_each"])
    # the check's second deployment, in bfloat16 and held to its first tokens, on the CPU twin too
    bf16 = deploy(ROOT / "specs" / "tiny_pd.yaml", ["def fib(n):"], 6, tmp_path / "bf16", timeout_s=300,
                  dtype="bfloat16", compare="first-token")
    assert bf16.get("error") is None and bf16["ok"] is True and bf16["first_tokens_equal"] is True
    assert (tmp_path / "bf16" / "tiny_pd_bfloat16.yaml").is_file()
