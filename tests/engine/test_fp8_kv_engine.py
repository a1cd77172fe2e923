"""`kv.dtype: fp8` in the engine, colocated: pages of float8_e4m3fn (a quarter of float32's bytes),
the same tokens from the reference backend and the native CPU kernels, prefix caching and the MTP
layer's draft KV in the same fp8 pool, and checkpoint scales reaching the pool."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.attention import cpu_backend  # noqa: E402
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.speculative.config import SpeculativeConfig  # noqa: E402

GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def prompts(n: int = 3, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 250, (5 + 9 * i,), generator=gen).tolist() for i in range(n)]


@pytest.mark.parametrize("model", ["qwen3-coder-tiny", "deepseek-r1-tiny"])
def test_fp8_pages_hold_one_byte_an_element_and_both_cpu_backends_give_the_same_tokens(model):
    if not cpu_backend.kernel_available():
        pytest.skip("CPU attention kernel not built")
    outs, pools = {}, {}
    for backend in ("torch_ref", "cpu"):
        config = EngineConfig(page_size=4, num_pages=64, kv_dtype="fp8", attention_backend=backend)
        with LLMEngine(model, config) as engine:
            cache = engine.kv.cache
            assert cache.dtype == torch.float8_e4m3fn and cache.fmt.elem_bytes == 1
            outs[backend] = [o.output_ids for o in engine.generate(prompts(), GREEDY)]
            pools[backend] = cache.fmt.pool_bytes
            assert cache.buffer.count_nonzero() > 0  # the KV went into the fp8 pages
    with LLMEngine(model, EngineConfig(page_size=4, num_pages=64, kv_dtype="float32")) as engine:
        assert engine.kv.cache.fmt.pool_bytes == 4 * pools["cpu"]
    assert outs["cpu"] == outs["torch_ref"]
    assert all(len(o) == GREEDY.max_tokens for o in outs["cpu"])


def test_a_repeated_prompt_reads_its_cached_fp8_pages_to_the_same_tokens():
    prompt = list(range(3, 40))  # 37 tokens: 9 full pages of 4
    with LLMEngine("qwen3-coder-tiny", EngineConfig(page_size=4, num_pages=64, kv_dtype="fp8")) as engine:
        first = engine.generate([prompt], GREEDY)[0]
        second = engine.generate([prompt], GREEDY)[0]
        assert engine.scheduler.prefix_cache.hits == 36
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 36
    assert second.output_ids == first.output_ids


def test_mtp_drafts_over_fp8_pages_keep_the_greedy_tokens():
    """The MTP layer's KV is one more layer of the same fp8 pool (its own scale); drafting, with
    the prefix cache on, changes no greedy token of the fp8 engine."""
    config = EngineConfig(page_size=4, num_pages=128, kv_dtype="fp8", prefix_caching=False)
    with LLMEngine("deepseek-r1-tiny", config) as engine:
        expected = [o.output_ids for o in engine.generate(prompts(), GREEDY)]
    spec = EngineConfig(page_size=4, num_pages=128, kv_dtype="fp8", speculative=SpeculativeConfig("mtp", 2))
    with LLMEngine("deepseek-r1-tiny", spec) as engine:
        assert engine.kv.cache.geometry.num_layers == engine.runner.model.arch.num_layers + 1
        assert len(engine.kv.cache.scales.k) == engine.kv.cache.geometry.num_layers
        got = [o.output_ids for o in engine.generate(prompts(), GREEDY)]
        assert engine.spec_stats.num_accepted_tokens > 0
    assert got == expected


def test_checkpoint_scales_reach_the_pool_and_change_the_stored_bytes(tmp_path):
    from tests.engine.test_kv_scales import checkpoint_with

    directory = checkpoint_with(tmp_path, "qwen3-coder-tiny", {"model.layers.0.self_attn.k_scale": torch.tensor(0.5)})
    stored = {}
    for name, model in (("unit", "qwen3-coder-tiny"), ("scaled", str(directory))):
        with LLMEngine(model, EngineConfig(page_size=4, num_pages=8, kv_dtype="fp8")) as engine:
            if name == "scaled":
                assert engine.kv.cache.k_scale(0) == 0.5 and engine.kv.cache.v_scale(0) == 1.0
                assert engine.kv.cache.k_scale(1) == 1.0
            engine.generate([list(range(3, 10))], SamplingParams(max_tokens=1))
            k, v = engine.kv.cache.k_v_token_major(0)
            stored[name] = (k[:2].float().clone(), v[:2].float().clone())
    # the same weights and tokens: layer 0's K is stored divided by 0.5, its V unchanged
    assert torch.equal(stored["scaled"][1], stored["unit"][1])
    unit_k, scaled_k = stored["unit"][0], stored["scaled"][0]
    # rounding to e4m3 commutes with doubling for normal values below saturation (not subnormals:
    # their grid is absolute)
    normal = (unit_k.abs() > 2.0**-6) & (unit_k.abs() < 100)  # 2^-6 itself may be a rounded subnormal
    assert normal.sum() > 100 and torch.equal(scaled_k[normal], 2 * unit_k[normal])


@pytest.mark.slow  # compiling the step takes ~35 s here
def test_the_compiled_step_over_fp8_pages_gives_the_eager_tokens():
    """The compiled step (on by default outside the tests) reaches the backend through graph ops;
    over fp8 pages it gives the eager step's tokens."""
    outs = {}
    for compile_step in (False, True):
        config = EngineConfig(page_size=4, num_pages=64, kv_dtype="fp8", compile=compile_step)
        with LLMEngine("qwen3-coder-tiny", config) as engine:
            assert (engine.runner.step is not None) == compile_step
            outs[compile_step] = [o.output_ids for o in engine.generate(prompts(), GREEDY)]
    assert outs[True] == outs[False]
