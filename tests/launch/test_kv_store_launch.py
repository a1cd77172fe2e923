"""The deployment's shared KV store (`$.kv.tiers.store: launch`), real processes: a prefix prefill unit A
computed is loaded from the store by prefill unit B, with the tokens of an engine that computed it all."""

from __future__ import annotations

import shutil
import time

import attrs
import pytest

pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.serve.backends.local import serve_locally
from tests.launch._helpers import live_descendants, make_spec

MODEL = "qwen3-coder-tiny"
GREEDY = SamplingParams(max_tokens=3, ignore_eos=True)

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None and shutil.which("valkey-server") is None,
                                reason="no redis-server or valkey-server: apt-get install redis-server")


def test_a_prefix_prefill_a_computed_is_served_to_prefill_b_from_the_store(tmp_path):
    before = live_descendants()
    spec = make_spec(MODEL, prefill_replicas=2, num_pages=96, budget=64, provider="tcp")
    spec = attrs.evolve(spec, engine=attrs.evolve(spec.engine, prefix_caching=True), kv=attrs.evolve(
        spec.kv, tiers=attrs.evolve(spec.kv.tiers, store="launch", store_gb=0.05, write_policy="write_through")))
    system = [(j * 7) % 250 + 2 for j in range(64)]  # 16 pages of 4 both prompts share
    first, second = system + [11, 12, 13], system + [21, 22, 23, 24]
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=256)) as reference:
        expected = [o.output_ids for o in reference.generate([first, second], GREEDY)]
    rt = serve_locally(spec, on_event=lambda _line: None, max_restarts=0, log_dir=str(tmp_path))
    try:
        got = [[t for e in rt.generate_batch([first], GREEDY, timeout_s=60)[0] for t in e.new_token_ids]]
        computed_by = [n for n, s in rt.unit_stats().items() if n.startswith("prefill") and s.counters.prefix_cache_queries]
        assert len(computed_by) == 1
        a = computed_by[0]
        deadline = time.monotonic() + 20
        while rt.unit_stats()[a].counters.kv_tier_written_bytes.get("store", 0) == 0:  # written in the background
            assert time.monotonic() < deadline, f"{a} wrote nothing to the store"
            time.sleep(0.1)
        rt.runtime.kill_unit(a)  # the next prompt can only go to the other prefill unit, whose pool never saw it
        while rt.runtime.units[a].healthy:
            time.sleep(0.05)
        got += [[t for e in rt.generate_batch([second], GREEDY, timeout_s=60)[0] for t in e.new_token_ids]]
        b = next(n for n in rt.unit_stats() if n.startswith("prefill") and n != a)
        counters = rt.unit_stats()[b].counters
    finally:
        rt.close()
    assert got == expected
    assert counters.kv_tier_hit_pages.get("store", 0) > 0
    assert counters.external_prefix_cache_hits >= 4 * counters.kv_tier_hit_pages["store"] > 0
    assert live_descendants() <= before, "a unit or the store outlived close()"
