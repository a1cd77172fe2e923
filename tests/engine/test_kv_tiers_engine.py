"""An engine's prefix cache over KV tiers (`kv.tiers`, `engine.kv_tier_pages`): pages evicted from a small
pool come back from the host, disk or store tier as hits, the tokens equal an engine without tiers, a
restarted engine finds its disk tier's pages, a corrupted page is recomputed and counted, and a dead
store costs hits only."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.kv_tier_pages import PoolPages  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.tier_settings import TierSettings  # noqa: E402
from tests.engine.test_prefix_caching import run_turns  # noqa: E402
from tests.multi_turn_prompts import conversations  # noqa: E402

MODEL = "qwen3-tiny"
SMALL_POOL = EngineConfig(page_size=4, num_pages=40, max_num_batched_tokens=32)


def tiers(tmp_path: os.PathLike[str] | None = None, host_bytes: int = 0, store: str | None = None,
          policy: str = "on_eviction") -> TierSettings:
    return TierSettings(host_bytes=host_bytes, disk_bytes=0 if tmp_path is None else 64 << 20,
                        disk_dir=str(tmp_path or ""), store_address=store, store_bytes=64 << 20,
                        write_policy=policy, model_identity=f"{MODEL}|dummy|seed=0")  # type: ignore[arg-type]


def uncached_tokens(model: str, convs: list[list[list[int]]]) -> dict[str, list[int]]:
    with LLMEngine(model, dataclasses.replace(SMALL_POOL, num_pages=256, prefix_caching=False)) as engine:
        return run_turns(engine, convs)


def test_pool_pages_round_trip_every_layer_of_a_page():
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=8)) as engine:
        pages = PoolPages(engine.runner.kv_cache)
        engine.runner.kv_cache.buffer.copy_(torch.randint(0, 256, engine.runner.kv_cache.buffer.shape,
                                                          dtype=torch.uint8))
        page3 = pages.read(3)
        assert len(page3) == pages.page_bytes == engine.runner.kv_cache.fmt.num_layers * engine.runner.kv_cache.fmt.page_bytes
        pages.write(5, page3)
        assert pages.read(5) == page3 and pages.read(4) != page3
        with pytest.raises(ValueError, match="bytes"):
            pages.write(5, page3[:-1])


@pytest.mark.parametrize("model,policy", [(MODEL, "on_eviction"), (MODEL, "write_through"),
                                          ("deepseek-r1-tiny", "on_eviction")])
def test_evicted_pages_come_back_from_the_host_tier_with_the_same_tokens(model, policy):
    convs = conversations(10, 3)  # their pages are ~3x the pool: it evicts pages a later turn wants again
    expected = uncached_tokens(model, convs)
    with LLMEngine(model, SMALL_POOL) as engine:
        without = run_turns(engine, convs)
        hits_without = engine.scheduler.prefix_cache.hits
    with LLMEngine(model, dataclasses.replace(SMALL_POOL, tiers=tiers(host_bytes=32 << 20, policy=policy))) as engine:
        got = run_turns(engine, convs)
        cache = engine.scheduler.prefix_cache
        counters = engine.counters()
    assert got == expected == without
    assert cache.tier_hits > 0 and cache.hits > hits_without  # the pool alone evicted what the tier kept
    assert counters.external_prefix_cache_hits == cache.tier_hits
    assert counters.kv_tier_hit_pages["host"] * 4 == cache.tier_hits
    assert counters.kv_tier_written_bytes["host"] > 0 and counters.kv_tier_corrupt_pages["host"] == 0


def test_a_restarted_engine_finds_its_disk_tiers_pages_and_recomputes_a_corrupted_one(tmp_path):
    convs = conversations(3, 2)
    expected = uncached_tokens(MODEL, convs)
    first_turns = [[conv[0]] for conv in convs]
    with LLMEngine(MODEL, dataclasses.replace(SMALL_POOL, tiers=tiers(tmp_path, policy="write_through"))) as engine:
        run_turns(engine, first_turns)
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert files, "the disk tier kept nothing"
    assert all(p.stat().st_size % 4096 == 0 for p in files)  # page-sized, aligned blocks
    entry = bytearray(files[0].read_bytes())
    entry[len(entry.rstrip(b"\0")) // 2] ^= 0xFF  # one bit pattern of one page's bytes, not the padding
    files[0].write_bytes(bytes(entry))
    with LLMEngine(MODEL, dataclasses.replace(SMALL_POOL, tiers=tiers(tmp_path))) as engine:  # the restart
        got = run_turns(engine, convs)
        cache, counters = engine.scheduler.prefix_cache, engine.counters()
    assert got == expected
    assert cache.tier_hits > 0  # the second turns found the first turns' pages on disk
    assert counters.kv_tier_corrupt_pages["disk"] == 1


def test_a_store_shared_by_two_engines_serves_one_engines_prefix_to_the_other_and_its_death_costs_hits_only(
        tmp_path):
    from disaggsdk.launch.kv_store_server import start_kv_store

    if shutil.which("redis-server") is None and shutil.which("valkey-server") is None:
        pytest.skip("no redis-server or valkey-server: apt-get install redis-server")
    convs = conversations(2, 2)
    expected = uncached_tokens(MODEL, convs)
    with start_kv_store(maxmemory_bytes=64 << 20) as store:
        shared = tiers(store=store.address, policy="write_through")
        with LLMEngine(MODEL, dataclasses.replace(SMALL_POOL, tiers=shared)) as a:
            run_turns(a, [[conv[0]] for conv in convs])
            assert a.scheduler.prefix_cache.tiers is not None and a.scheduler.prefix_cache.tiers.flush()
        with LLMEngine(MODEL, dataclasses.replace(SMALL_POOL, tiers=shared)) as b:  # a fresh pool: only the store
            got = run_turns(b, convs)
            assert b.scheduler.prefix_cache.tier_hits > 0
            assert b.counters().kv_tier_hit_pages["store"] > 0
        assert got == expected
        with LLMEngine(MODEL, dataclasses.replace(SMALL_POOL, tiers=shared)) as c:
            store.stop()  # mid-run: every request still completes, with the same tokens
            got = run_turns(c, convs)
            errors = c.counters().kv_tier_errors["store"]
    assert got == expected
    assert errors > 0


@pytest.mark.gpu
def test_pool_pages_of_a_cuda_pool_go_through_pinned_memory_and_equal_the_cpu_twins():
    from tests.declared_skips import no_gpu

    if not torch.cuda.is_available():
        pytest.skip(no_gpu("needs an NVIDIA GPU: the host tier's copy out of a CUDA pool"))
    from disaggsdk.engine.kv_cache import KVCache
    from disaggsdk.engine.modeling.base import kv_geometry
    from disaggsdk.engine.parallel import TensorParallel
    from disaggsdk.models import resolve_model

    geometry = kv_geometry(resolve_model(MODEL), TensorParallel())
    cpu = KVCache(geometry, num_pages=8, page_size=4, dtype="bfloat16", device="cpu")
    cuda = KVCache(geometry, num_pages=8, page_size=4, dtype="bfloat16", device="cuda")
    cpu.buffer.copy_(torch.randint(0, 256, cpu.buffer.shape, dtype=torch.uint8))
    cuda.buffer.copy_(cpu.buffer)
    cpu_pages, cuda_pages = PoolPages(cpu), PoolPages(cuda)
    assert cuda_pages._staging.is_pinned()
    assert [cuda_pages.read(p) for p in range(8)] == [cpu_pages.read(p) for p in range(8)]
    cuda_pages.write(6, cpu_pages.read(2))
    torch.cuda.synchronize()
    assert torch.equal(cuda.buffer.cpu().view(cpu.fmt.num_layers, 8, -1)[:, 6],
                       cpu.buffer.view(cpu.fmt.num_layers, 8, -1)[:, 2])


def test_a_prefix_cache_reset_empties_the_units_own_tiers(tmp_path):
    prompt = conversations(1, 1)[0][0]
    with LLMEngine(MODEL, dataclasses.replace(SMALL_POOL, tiers=tiers(tmp_path, host_bytes=8 << 20,
                                                                      policy="write_through"))) as engine:
        engine.generate([prompt], SamplingParams(max_tokens=2, ignore_eos=True))
        stack = engine.scheduler.prefix_cache.tiers
        assert stack is not None and stack.flush()  # the writer thread wrote them through to disk
        assert any(p.is_file() for p in tmp_path.rglob("*"))
        engine.kv.reset_prefix_cache()
        assert not any(p.is_file() for p in tmp_path.rglob("*"))  # the disk tier's files are gone
        again = engine.generate([prompt], SamplingParams(max_tokens=2, ignore_eos=True))[0]
        assert again.num_cached_tokens == 0 and engine.scheduler.prefix_cache.tier_hits == 0
