"""Every cuda-python driver call of the cuMem pools binds to the installed cuda-python (CPU, no GPU).

The project's own code runs (`CudaSharedAllocation`, `CudaSharedMapping`, the rank pool hand-over
over a Unix socket, their error paths) in a process of its own where every driver call goes to the
real cuda-python binding, which converts and checks the arguments, and loading libcuda is blocked:
tests/gpu_api/cuda_driver_calls.py says how.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def _report() -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.gpu_api.cuda_driver_calls"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_cumem_pools_call_the_installed_driver_bindings():
    report = _report()
    assert report["mismatches"] == []
    assert report["scenarios"] == {name: "ok" for name in report["scenarios"]}, report["scenarios"]
    assert {"create_and_close", "import_and_close", "rank_pool_hand_over"} <= set(report["scenarios"])
    # every driver function the package names was called through the binding at least once: a call
    # added to the code and missing from the scenarios fails here
    assert report["in_source"], "the scan for driver calls found none"
    assert set(report["in_source"]) <= set(report["calls"]), set(report["in_source"]) - set(report["calls"])


def test_the_binding_refuses_a_wrong_call():
    """The check can fail: a bare descriptor where cuMemSetAccess takes a list is refused by the binding."""
    assert _report()["self_check"] == "refused"
