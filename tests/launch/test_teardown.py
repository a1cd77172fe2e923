"""SIGTERM / SIGINT on a running deployment leave no process and no shared memory; colocated
mode with one core per unit serves the same tokens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.serve.backends.local import serve_locally
from tests.conftest import ROOT, start_cli_server
from tests.launch._helpers import child_pids, make_spec

LAUNCHER_DEATH_CLEANUP_S = 15  # issue 33: a unit's /dev/shm files go within this of its launcher's SIGKILL


def _alive(pids: set[int]) -> set[int]:
    """Which of ``pids`` still run (orphans are re-parented, so look them up by pid)."""
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.add(pid)
        except OSError:
            pass
    return alive


def _fabric_shm_of(pids: set[int]) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.split(":")[0].isdigit() and int(n.split(":")[0]) in pids]


@pytest.mark.parametrize("sig", [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)])
def test_a_signal_mid_generation_leaves_nothing_behind(sig):
    # a long generation, so the signal arrives while every unit is up and busy
    argv = [sys.executable, "-m", "disaggsdk.cli.main", "generate", "--spec", "specs/tiny_local.yaml",
            "--prompt-ids", ",".join(["7"] * 40), "--max-tokens", "2000", "--ignore-eos"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 120
        ready = ""
        while "ready:" not in ready:  # the runtime prints one line once every unit started
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            ready += proc.stderr.readline()
        time.sleep(0.5)
        seen = child_pids(proc.pid)
        assert len(seen) >= 3 and _fabric_shm_of(seen)
        proc.send_signal(sig)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.5)
    assert not _alive(seen), "a unit or tp worker outlived its launcher"
    assert not _fabric_shm_of(seen), "shared memory left behind"


def test_units_of_a_launcher_killed_with_sigkill_exit_and_remove_their_shm_files():
    import httpx

    from disaggsdk.transfer.shm_files import remove_fabric_shm

    proc, url = start_cli_server("launch", "specs/tiny_pd.yaml", "--port", "0", "--no-live")
    units: set[int] = set()
    try:
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200, r.text  # a KV handoff ran: both units' endpoints are in use
        units = child_pids(proc.pid)
        assert len(units) >= 2 and _fabric_shm_of(units), "the reproduction needs the units' shm files"
        proc.kill()  # no unwinding in the launcher, no Shutdown for its units
        proc.wait(10)
        deadline = time.monotonic() + LAUNCHER_DEATH_CLEANUP_S
        while (_alive(units) or _fabric_shm_of(units)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(units), "a unit or tp worker outlived its launcher"
        assert not _fabric_shm_of(units), f"left in /dev/shm: {_fabric_shm_of(units)}"
    finally:  # what a failed run left: the launcher, its units, their files
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in _alive(units):
            os.kill(pid, signal.SIGKILL)
        for pid in units:
            remove_fabric_shm(pid)
        proc.stdout.close()


def test_colocated_pinned_units_serve_the_same_tokens():
    spec = make_spec("qwen3-coder-tiny", decode_replicas=1)
    prompts = [[5, 6, 7, 8, 9], [11] * 19]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    cores = sorted(os.sched_getaffinity(0))
    with serve_locally(spec, colocated=True, cpu_affinity="auto", on_event=lambda _l: None) as rt:
        assert {u.args.role for u in rt.runtime.units.values()} == {"mixed"}
        for i, u in enumerate(rt.runtime.units.values()):
            assert os.sched_getaffinity(u.process.pid) == {cores[i % len(cores)]}
        got = [[t for e in ev for t in e.new_token_ids] for ev in rt.generate_batch(prompts, params)]
        stats = rt.stats()
    with LLMEngine("qwen3-coder-tiny", EngineConfig(page_size=4, num_pages=64)) as engine:
        assert got == [o.output_ids for o in engine.generate(prompts, params)]
    assert all(s.role == "mixed" and s.counters.transfer_bytes == 0 for s in stats)


def test_a_dead_tp_worker_brings_its_unit_down_and_the_rest_serves(tmp_path):
    spec = make_spec("qwen3-coder-tiny", decode_tp=2, decode_replicas=2)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    with serve_locally(spec, on_event=lambda _l: None, log_dir=str(tmp_path), max_restarts=0) as rt:
        workers = child_pids(rt.runtime.units["decode-0"].process.pid)
        assert workers, "decode-0 should have a tp worker"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        outcomes = []
        while rt.runtime.units["decode-0"].healthy:  # its next step finds the dead rank and the unit exits
            assert time.monotonic() < deadline, "decode-0 never noticed its dead tp worker"
            outcomes += rt.generate_batch([[5, 6, 7, 8, 9]], params, timeout_s=60)
        assert any("decode-0" in f and "last lines" in f for f in rt.runtime.failures)
        # the request decode-0 held when it died had no token yet: the router moved it to decode-1
        assert all(ev[-1].finish_reason == "length" for ev in outcomes), outcomes
        assert outcomes[-1][-1].instance == "decode-1"
        events = rt.generate_batch([[5, 6, 7, 8, 9], [9, 8, 7]], params, timeout_s=60)
        assert all(ev[-1].finish_reason == "length" and ev[-1].instance == "decode-1" for ev in events)
        stats = rt.unit_stats()
        assert set(stats) == {"prefill-0", "decode-1"}
