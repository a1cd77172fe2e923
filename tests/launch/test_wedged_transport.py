"""A unit killed inside libfabric shm's critical section on a peer's queue: the deployment heals.

The killed prefill leaves the decode unit's queue lock held by nobody alive, so every later
write or message to that decode unit spins forever (native/README.md). Before the transport
watchdog, such a deployment stayed up and answered nothing for good. Now the unit whose thread
got stuck reports it and exits, the runtime replaces the poisoned decode unit too, requests in
flight complete or end with an error (none hangs), and afterwards the same prompt gives the same
tokens with every page back. The lock state is produced on purpose: tests/fault_injection.
"""

from __future__ import annotations

import os
import threading
import time

import attrs
import pytest

pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.serve.backends.local import serve_locally
from tests.fault_injection import build_freeze_shim, freeze_then_kill, preload_env
from tests.launch._helpers import live_descendants, make_spec

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)
STUCK_AFTER_S = 1.5


def tokens(events) -> list[int]:
    return [t for e in events for t in e.new_token_ids]


def test_a_poisoned_decode_queue_is_replaced_and_serving_resumes(tmp_path, monkeypatch):
    before = live_descendants()
    shm_before = set(os.listdir("/dev/shm"))
    shim = build_freeze_shim(tmp_path)
    for key, value in preload_env(shim, tmp_path).items():  # every unit (and restart) loads the injector
        monkeypatch.setenv(key, value)
    spec = make_spec("qwen3-tiny", provider="shm", deadline_s=5.0)
    spec = attrs.evolve(spec, transport=attrs.evolve(spec.transport, stuck_after_s=STUCK_AFTER_S))
    probe = [[5, 6, 7, 8, 9, 10, 11]]
    pids = set()
    with serve_locally(spec, on_event=lambda _l: None, max_restarts=3) as rt:
        baseline = tokens(rt.generate_batch(probe, GREEDY, timeout_s=60)[0])
        decode_before = rt.runtime.units["decode-0"].info.incarnation
        pids |= {u.process.pid for u in rt.runtime.units.values()}

        outcomes: list[str] = []
        stop = threading.Event()

        def load() -> None:  # keep the prefill unit writing KV into the decode unit
            i = 0
            while not stop.is_set():
                prompts = [[(i * 7 + j) % 200 + 3 for j in range(40)] for i in range(i, i + 4)]
                i += 4
                try:
                    batch = rt.generate_batch(prompts, GREEDY, timeout_s=120)
                except Exception as exc:  # noqa: BLE001 - routing refused while no decode unit is up
                    outcomes.append(f"refused: {exc}")
                    time.sleep(0.2)
                    continue
                outcomes.extend("error" if ev[-1].error else "ok" for ev in batch)

        loader = threading.Thread(target=load, daemon=True)
        loader.start()
        try:
            while rt.unit_stats()["prefill-0"].counters.transfer_writes == 0:
                time.sleep(0.01)
            freeze_then_kill(rt.runtime.units["prefill-0"].process.pid, tmp_path)

            deadline = time.monotonic() + 120
            while not any("inside libfabric" in f for f in rt.runtime.failures):
                assert time.monotonic() < deadline, f"no unit reported a stuck transport: {rt.runtime.failures}"
                time.sleep(0.1)
            while not all(u.healthy for u in rt.runtime.units.values()) or \
                    rt.runtime.units["decode-0"].info.incarnation == decode_before:
                assert time.monotonic() < deadline, "the poisoned decode unit was not replaced"
                time.sleep(0.1)
        finally:
            stop.set()
            loader.join(180)
        assert not loader.is_alive(), "a request hung"
        pids |= {u.process.pid for u in rt.runtime.units.values()}

        assert tokens(rt.generate_batch(probe, GREEDY, timeout_s=60)[0]) == baseline
        deadline = time.monotonic() + 30
        while not all(s.num_free_pages == s.num_pages for s in rt.unit_stats().values()):
            assert time.monotonic() < deadline, f"pages not returned: {rt.unit_stats()}"
            time.sleep(0.2)
        assert "ok" in outcomes  # load ran before the fault (what followed: ok, error or refused)
        reports = "\n".join(rt.runtime.failures)
        assert "inside libfabric" in reports and "decode-0" in reports
    assert live_descendants() <= before
    left = {n for n in set(os.listdir("/dev/shm")) - shm_before if n.split(":")[0] in {str(p) for p in pids}}
    assert not left, f"shm files left behind: {left}"
