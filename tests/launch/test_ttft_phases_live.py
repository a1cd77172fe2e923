"""TTFT phases measured on a real deployment: one prefill and one decode process over shm."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.report.ttft_phases import PHASES
from disaggsdk.serve.backends.local import serve_locally
from tests.launch._helpers import live_descendants, make_spec


def test_every_handed_off_request_has_its_phases():
    spec = make_spec("qwen3-coder-tiny", page_size=16, budget=64)
    before = live_descendants()
    prompts = [[(i * 31 + j * 7) % 250 + 2 for j in range(n)] for i, n in enumerate((40, 57, 1))]
    with serve_locally(spec, on_event=lambda _line: None) as rt:
        rt.generate_batch(prompts[:1], SamplingParams(max_tokens=1), prefix="before")  # not counted
        since = time.monotonic()
        events = rt.generate_batch(prompts, SamplingParams(max_tokens=2, ignore_eos=True), timeout_s=120)
        phases = rt.ttft_phases(since)
    assert live_descendants() <= before
    assert all(ev[-1].finish_reason == "length" for ev in events)
    # the one-token prompt has nothing to prefill: the decode unit takes it at once, unmeasured
    assert phases["requests"] == 2 and phases["unmeasured"] == 1, phases
    mean = phases["mean_ms"]
    assert all(mean[p] >= 0 for p in PHASES), mean  # one clock: every mark follows the one before
    assert mean["prefill_compute"] > 0 and mean["first_step_to_router"] > 0
    assert sum(mean[p] for p in PHASES) == pytest.approx(mean["server_ttft"])
