"""A unit that dies comes back: a new incarnation, its peers told, serving as before; bounded."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.serve.backends.local import serve_locally
from tests.launch._helpers import live_descendants, make_spec

GREEDY = SamplingParams(max_tokens=3, ignore_eos=True)


def wait_healthy_again(rt, name: str, old_incarnation: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        u = rt.runtime.units[name]
        if u.healthy and u.info.incarnation != old_incarnation:
            return
        assert time.monotonic() < deadline, f"{name} did not come back"
        time.sleep(0.1)


def test_dead_units_are_restarted_and_rejoin_their_peers():
    before = live_descendants()
    spec = make_spec("qwen3-coder-tiny", provider="tcp")  # tcp: see test_lifecycle.py on shm and SIGKILL
    with serve_locally(spec, on_event=lambda _l: None, max_restarts=2) as rt:
        # two prompts with no page in common: after a restart the decode unit's prefix cache holds
        # the first one, and only a prompt it has not seen makes it ask the prefill unit again
        baseline, other = ([t for e in ev for t in e.new_token_ids]
                           for ev in rt.generate_batch([[5, 6, 7, 8, 9], [9, 8, 7, 6, 5]], GREEDY))

        old = rt.runtime.units["decode-0"].info.incarnation
        rt.runtime.kill_unit("decode-0")
        wait_healthy_again(rt, "decode-0", old)
        events = rt.generate_batch([[5, 6, 7, 8, 9]], GREEDY, timeout_s=60)[0]
        assert [t for e in events for t in e.new_token_ids] == baseline and events[-1].instance == "decode-0"

        old = rt.runtime.units["prefill-0"].info.incarnation
        rt.runtime.kill_unit("prefill-0")
        wait_healthy_again(rt, "prefill-0", old)
        writes_before = rt.unit_stats()["prefill-0"].counters.transfer_writes
        events = rt.generate_batch([[9, 8, 7, 6, 5]], GREEDY, timeout_s=60)[0]
        assert [t for e in events for t in e.new_token_ids] == other
        stats = rt.unit_stats()
        # the decode unit learnt the new prefill incarnation: the KV came from it, not a local prefill
        assert stats["prefill-0"].counters.transfer_writes > writes_before and stats["decode-0"].counters.prefilled_locally == 0
        assert sum("died" in f for f in rt.runtime.failures) == 2

        # bounded: once its restarts are used, a unit stays down and the router says it cannot serve
        for attempt in range(2):
            old = rt.runtime.units["decode-0"].info.incarnation
            rt.runtime.kill_unit("decode-0")
            if attempt == 0:
                wait_healthy_again(rt, "decode-0", old)
        deadline = time.monotonic() + 30
        while rt.unrecoverable() is None:
            assert time.monotonic() < deadline, "a unit with no restarts left still counted as recoverable"
            time.sleep(0.1)
        assert "none can be restarted" in rt.unrecoverable()
    assert live_descendants() <= before
