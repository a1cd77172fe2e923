"""`disaggsdk launch` and `disaggsdk bench SPEC` as real commands: ready, serve, SIGTERM, no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT, start_cli_server


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid``."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent_of[int(entry)] = int(fields[1])
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, parent in parent_of.items() if parent in frontier} - out
        out |= frontier
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def still_alive(pids: set[int], wait_s: float = 10) -> list[int]:
    """The pids still running after up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def reap(proc: subprocess.Popen, kids: set[int]) -> None:
    """Kill what a failed test left running, and the units' libfabric shm files."""
    from disaggsdk.transfer.shm_files import remove_fabric_shm

    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for p in kids:
        if alive(p):
            os.kill(p, signal.SIGKILL)
        remove_fabric_shm(p)


def test_launch_serves_until_sigterm_and_leaves_no_orphan():
    proc, url = start_launch("specs/tiny_pd.yaml")
    kids: set[int] = set()
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 4, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        kids = descendants(proc.pid)
        assert len(kids) >= 2  # the prefill and decode units (and their helpers)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out  # terminated, after a clean shutdown
        assert "stopped" in out
        assert not still_alive(kids)
    finally:
        reap(proc, kids)


def start_launch(spec: str, *options: str) -> tuple[subprocess.Popen, str]:
    """`disaggsdk launch SPEC --port 0 --no-live OPTIONS`, once ready; (process, base url)."""
    return start_cli_server("launch", spec, "--port", "0", "--no-live", *options)


def test_bench_spec_launches_loads_and_tears_down(run_cli, tmp_path):
    out = tmp_path / "bench.json"
    p = run_cli("bench", "specs/tiny_pd.yaml", "--num-prompts", "4", "--input-len", "32", "--output-len", "4",
                "--qps", "20", "--json", "--output", str(out), timeout_s=180)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["completed"] == 4 and result["total_output_tokens"] == 16
    assert json.loads(out.read_text()) == result
    assert "ready" in p.stderr
    # every request was prefilled on the prefill unit and handed off: its TTFT comes in phases
    phases = result["ttft_phases"]
    assert phases["requests"] == 4 and phases["mean_ms"]["prefill_compute"] > 0
    assert phases["mean_ms"]["http_and_client"] == pytest.approx(result["mean_ttft_ms"] - phases["mean_ms"]["server_ttft"])
    assert "speculative" not in result  # no drafts, no acceptance figures


def test_bench_of_a_speculative_spec_reports_this_runs_acceptance(run_cli, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(open("specs/tiny_pd.yaml").read() + "speculative:\n  method: ngram\n  num_tokens: 3\n")
    p = run_cli("bench", str(spec), "--num-prompts", "4", "--input-len", "32", "--output-len", "24",
                "--qps", "20", "--json", timeout_s=180)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["completed"] == 4 and result["total_output_tokens"] == 96
    spec_stats = result["speculative"]
    assert spec_stats["num_draft_tokens"] > 0 and len(spec_stats["per_position_acceptance"]) == 3
    assert spec_stats["mean_accepted_length"] >= 1.0


def test_sigterm_during_bench_of_a_spec_stops_units_and_removes_shared_memory():
    """Commands that own a deployment (here `bench SPEC`) unwind on SIGTERM like on Ctrl-C."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "disaggsdk.cli.main", "bench", "specs/tiny_pd.yaml", "--num-prompts", "500",
         "--qps", "5", "--input-len", "32", "--output-len", "8", "--no-live"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    kids: set[int] = set()
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "ready in" in line:
                break
        assert any("ready in" in line for line in lines), "".join(lines)
        time.sleep(1.0)  # load is flowing: writes in flight
        kids = descendants(proc.pid)
        assert len(kids) >= 2
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 143, out
        assert "Traceback" not in out, out
        assert not still_alive(kids)
        # libfabric shm names its files after the owning pid: none of the units' is left
        left = [f for f in os.listdir("/dev/shm") if any(f.startswith(f"{p}:") for p in kids)]
        assert not left, left
    finally:
        reap(proc, kids)


def test_a_busy_port_fails_before_any_unit_starts(run_cli):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        p = run_cli("launch", "specs/tiny_pd.yaml", "--port", str(port), "--no-live", timeout_s=60)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in p.stderr and "Traceback" not in p.stderr
    assert "ready:" not in p.stderr and "ready in" not in p.stdout  # no unit was started


def test_the_launcher_exits_with_a_clear_message_when_no_decode_unit_can_come_back():
    proc, _url = start_launch("specs/tiny_pd.yaml", "--max-restarts", "0")
    kids: set[int] = set()
    try:
        kids = descendants(proc.pid)
        for pid in direct_children(proc.pid):  # the unit processes (and multiprocessing's tracker)
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 2, out
        assert "none can be restarted" in out and "Traceback" not in out
        assert not still_alive(kids)
    finally:
        reap(proc, kids)


def direct_children(pid: int) -> set[int]:
    out = set()
    for p in descendants(pid):
        try:
            with open(f"/proc/{p}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.add(p)
        except OSError:
            pass
    return out
