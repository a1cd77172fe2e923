"""`disaggsdk launch SPEC --backend ray` without an address, where no Ray cluster runs: the launch
starts a one-node cluster of its own (offering the `disaggsdk_slot`s the CPU spec needs), serves,
and stops it at shutdown. Its own module: with another cluster running on the machine (the other Ray
tests' module fixture), "no address" would join that one instead, as Ray's ``address="auto"`` does."""

from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

from tests.launch.test_ray_runtime import our_processes


@pytest.mark.deps_smoke  # make test-latest / test-oldest (tools/deps_check.py)
def test_cli_launch_on_ray_without_an_address_starts_its_own_cluster():
    """No --address: a one-node cluster of this machine, started and left by the launch itself."""
    import signal
    import subprocess
    import sys

    import httpx

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    raylets_before = _raylets()
    spec = os.path.join(os.path.dirname(__file__), "..", "..", "specs", "tiny_local.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "disaggsdk.cli.main", "launch", spec, "--backend", "ray",
                             "--port", "0", "--no-live"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env=env)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ready in"):
                break
        assert lines and lines[-1].startswith("ready in"), "launch exited before it was ready:\n" + "".join(lines)
        url = "http" + lines[-1].split("http", 1)[1].split("/v1")[0]
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "def f(x):", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
        assert any(line.startswith("placement: ") for line in lines)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert not our_processes()
    deadline = time.monotonic() + 30
    while _raylets() > raylets_before and time.monotonic() < deadline:  # its cluster goes with it
        time.sleep(0.5)
    assert _raylets() <= raylets_before


def _raylets() -> int:
    count = 0
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                count += entry.isdigit() and b"/raylet" in f.read().split(bytes(1))[0]
        except OSError:
            continue
    return count
