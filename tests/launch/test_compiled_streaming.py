"""A disaggregated deployment whose units compile their step: the in-graph layer counter drives the
layer streaming, and the tokens are those of the eager colocated engine."""

from __future__ import annotations

import re

import attrs
import httpx
import pytest

pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.face.deployment import Deployment
from disaggsdk.serve.backends.local import serve_locally
from tests.launch._helpers import live_descendants, make_spec

MODEL = "qwen3-tiny"
PROMPT_LENGTHS = (200, 33, 7)


def test_compiled_units_stream_layers_during_the_forward_and_match_eager():
    prompts = [[(i * 31 + j * 7) % 250 + 2 for j in range(n)] for i, n in enumerate(PROMPT_LENGTHS)]
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    with LLMEngine(MODEL, EngineConfig(page_size=16, num_pages=64, compile=False)) as engine:
        eager = [o.output_ids for o in engine.generate(prompts, params)]
    spec = make_spec(MODEL, page_size=16, budget=256)  # each prompt prefilled in one step
    spec = attrs.evolve(spec, engine=attrs.evolve(spec.engine, compile=True))
    before = live_descendants()
    lines: list[str] = []
    with serve_locally(spec, on_event=lines.append) as rt, Deployment(rt) as d:
        # the units serve at once and compile in the background; the requests wait for the compiled steps
        assert set(httpx.get(f"{d.url}/health").json()["compile"].values()) <= {"compiling", "compiled"}
        assert d.wait_until_compiled(600) == {"prefill-0": "compiled", "decode-0": "compiled"}
        assert httpx.get(f"{d.url}/health").json()["compile"] == {"prefill-0": "compiled", "decode-0": "compiled"}
        assert sum(bool(re.search(r"-0: compiled in \d+\.\d s: runs the compiled step", line)) for line in lines) == 2
        events = rt.generate_batch(prompts, params, timeout_s=180)
        stats = rt.unit_stats()
    assert live_descendants() <= before
    assert [[t for e in ev for t in e.new_token_ids] for ev in events] == eager
    records = {r.request_id: r for s in stats.values() if s.role == "prefill" for r in s.recent}
    longest = next(r for r in records.values() if r.num_tokens == PROMPT_LENGTHS[0])
    # the first layer's writes went out before the (single-step) forward pass ended: the counter
    # op inside the compiled graph woke the streamer mid-forward
    assert longest.lead_s > 0, longest
