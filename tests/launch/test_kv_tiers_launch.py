"""KV tiers in a launched deployment, real processes: a prefix prefill unit A computed is loaded from the
deployment's store (`$.kv.tiers.store: launch`) by prefill unit B, and a restarted unit's disk tier
serves its pages again; tokens equal an engine that computed everything."""

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
from tests.launch.test_restart import wait_healthy_again

MODEL = "qwen3-coder-tiny"
GREEDY = SamplingParams(max_tokens=3, ignore_eos=True)

no_store = pytest.mark.skipif(shutil.which("redis-server") is None and shutil.which("valkey-server") is None,
                              reason="no redis-server or valkey-server: apt-get install redis-server")


def tokens(rt, prompt: list[int]) -> list[int]:
    return [t for e in rt.generate_batch([prompt], GREEDY, timeout_s=60)[0] for t in e.new_token_ids]


def test_a_restarted_prefill_units_disk_tier_serves_its_pages_again(tmp_path):
    before = live_descendants()
    spec = make_spec(MODEL, num_pages=96, budget=64, provider="tcp")  # tcp: see test_lifecycle.py on shm and SIGKILL
    spec = attrs.evolve(spec, engine=attrs.evolve(spec.engine, prefix_caching=True), kv=attrs.evolve(
        spec.kv, tiers=attrs.evolve(spec.kv.tiers, disk_gb=0.05, disk_path=str(tmp_path / "disk"),
                                    write_policy="write_through")))
    system = [(j * 11) % 250 + 2 for j in range(64)]
    first, second = system + [31, 32, 33], system + [41, 42]
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=256)) as reference:
        expected = [o.output_ids for o in reference.generate([first, second], GREEDY)]
    with serve_locally(spec, on_event=lambda _line: None, max_restarts=1, log_dir=str(tmp_path / "logs")) as rt:
        got = [tokens(rt, first)]
        deadline = time.monotonic() + 20
        while rt.unit_stats()["prefill-0"].counters.kv_tier_written_bytes.get("disk", 0) == 0:
            assert time.monotonic() < deadline, "prefill-0 wrote nothing to its disk tier"
            time.sleep(0.1)
        old = rt.runtime.units["prefill-0"].info.incarnation
        rt.runtime.kill_unit("prefill-0")
        wait_healthy_again(rt, "prefill-0", old)
        got.append(tokens(rt, second))
        counters = rt.unit_stats()["prefill-0"].counters  # the new incarnation's: its pool started empty
    assert got == expected
    assert counters.kv_tier_hit_pages.get("disk", 0) > 0
    assert live_descendants() <= before, "a unit outlived close()"


@no_store
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
        got = [tokens(rt, first)]
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
        got.append(tokens(rt, second))
        b = next(n for n in rt.unit_stats() if n.startswith("prefill") and n != a)
        counters = rt.unit_stats()[b].counters
    finally:
        rt.close()
    assert got == expected
    assert counters.kv_tier_hit_pages.get("store", 0) > 0
    assert counters.external_prefix_cache_hits >= 4 * counters.kv_tier_hit_pages["store"] > 0
    assert live_descendants() <= before, "a unit or the store outlived close()"
