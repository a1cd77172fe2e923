"""Prefix caching in the engine: a hit computes only the suffix, and changes no token, under
multi-turn load with evictions, preemptions and aborts; evicted pages are never read as cached."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.kv.block_hash import page_hashes  # noqa: E402
from tests.multi_turn_prompts import conversations  # noqa: E402

MODEL = "qwen3-tiny"
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def run_turns(engine: LLMEngine, convs: list[list[list[int]]], abort_every: int = 0) -> dict[str, list[int]]:
    """Turn by turn (every conversation's turn k as one batch); every ``abort_every``-th request is
    aborted after one step."""
    tokens, n = {}, 0
    for k in range(len(convs[0])):
        for c, conv in enumerate(convs):
            engine.add_request(f"c{c}t{k}", conv[k], GREEDY)
            n += 1
            if abort_every and n % abort_every == 0:
                engine.step()
                engine.abort(f"c{c}t{k}")
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished and out.finish_reason != "abort":
                    tokens[out.request_id] = out.output_ids
    return tokens


def test_a_repeated_prompt_computes_only_its_last_page():
    prompt = list(range(3, 40))  # 37 tokens: 9 full pages of 4
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=64)) as engine:
        first = engine.generate([prompt], GREEDY)[0]
        steps = []
        engine.on_step = lambda chunks: steps.extend(chunks)
        second = engine.generate([prompt], GREEDY)[0]
    assert second.output_ids == first.output_ids
    assert first.num_cached_tokens == 0 and second.num_cached_tokens == 36
    assert steps[0].start_pos == 36 and steps[0].num_tokens == 1  # the prefill was one token
    assert engine.scheduler.prefix_cache.hits == 36
    assert engine.scheduler.prefix_cache.queries == 2 * len(prompt)


@pytest.mark.parametrize("model,num_pages", [(MODEL, 256), (MODEL, 40), ("deepseek-r1-tiny", 40)])
def test_multi_turn_tokens_equal_the_uncached_engine_with_evictions_and_aborts(model, num_pages):
    convs = conversations(4, 3)
    config = EngineConfig(page_size=4, num_pages=num_pages, max_num_batched_tokens=32)
    with LLMEngine(model, EngineConfig(page_size=4, num_pages=256, prefix_caching=False)) as engine:
        expected = run_turns(engine, convs, abort_every=5)
        assert engine.scheduler.prefix_cache.hits == 0
    with LLMEngine(model, config) as engine:
        got = run_turns(engine, convs, abort_every=5)
        hits, queries = engine.scheduler.prefix_cache.hits, engine.scheduler.prefix_cache.queries
        assert engine.kv.num_free_pages == num_pages  # drained: every page free or evictable
        evictions = engine.allocator.cache.num_evictions
    assert got == expected
    assert hits > 0.4 * queries
    if num_pages == 40:
        assert evictions > 0  # the small pool reused cached pages for other prompts


def test_a_preempted_request_that_shared_pages_recomputes_to_the_same_tokens():
    system = list(range(10, 34))  # 6 pages of 4, cached by a first request
    prompts = [system + [40, 41, 42], system + [50, 51, 52]]
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=64, prefix_caching=False)) as engine:
        expected = [o.output_ids for o in engine.generate(prompts, params)]
    # both share the 6 system pages; each then needs 6 more of its own: 18 > 16, one is preempted
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=16, max_num_batched_tokens=16)) as engine:
        engine.generate([system + [60]], SamplingParams(max_tokens=1))
        outs = engine.generate(prompts, params)
        assert engine.scheduler.num_preemptions > 0 and engine.kv.num_free_pages == 16
    assert [o.output_ids for o in outs] == expected
    assert [o.num_cached_tokens for o in outs] == [24, 24]


def test_an_evicted_page_is_never_read_as_the_prompt_it_held():
    # prompt A is cached, then B and C fill the pool, evicting A's pages and writing their own KV
    # into them; A again must find nothing cached (or only pages still holding A) and equal a
    # fresh engine's tokens
    rng = random.Random(3)
    a, b, c = ([rng.randrange(256) for _ in range(30)] for _ in range(3))
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=24, prefix_caching=False)) as engine:
        fresh = engine.generate([a], GREEDY)[0].output_ids
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=24)) as engine:
        engine.generate([a], GREEDY)
        a_pages = set(engine.allocator.lookup(page_hashes(a, 4)))
        assert len(a_pages) == 7
        engine.generate([b, c], GREEDY)
        assert engine.allocator.cache.num_evictions > 0
        reused = a_pages & {p for p in range(24) if engine.allocator.cache.is_cached(p)}
        again = engine.generate([a], GREEDY)[0]
    assert len(reused) < len(a_pages)  # some of A's pages now hold B's or C's tokens
    assert again.output_ids == fresh
    assert again.num_cached_tokens < 28


def test_prompt_logprobs_requests_compute_every_position():
    prompt = list(range(3, 30))
    params = SamplingParams(max_tokens=2, ignore_eos=True, prompt_logprobs=0)
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=64)) as engine:
        first = engine.generate([prompt], params)[0]
        second = engine.generate([prompt], params)[0]
    assert second.num_cached_tokens == 0
    assert [lp and lp.token_id for lp in second.prompt_logprobs] == [lp and lp.token_id for lp in first.prompt_logprobs]


@pytest.mark.parametrize("num_drafts", [1, 3])
def test_mtp_drafting_with_the_cache_gives_the_uncached_tokens(num_drafts):
    from disaggsdk.engine.speculative.config import SpeculativeConfig

    convs = conversations(3, 3, seed=2)
    spec = SpeculativeConfig("mtp", num_drafts)
    with LLMEngine("deepseek-r1-tiny", EngineConfig(page_size=4, num_pages=256, prefix_caching=False)) as engine:
        expected = run_turns(engine, convs)
    with LLMEngine("deepseek-r1-tiny", EngineConfig(page_size=4, num_pages=256, speculative=spec)) as engine:
        got = run_turns(engine, convs)
        assert engine.scheduler.prefix_cache.hash_lookahead == 1 and engine.scheduler.prefix_cache.hits > 0
        assert engine.spec_stats.num_accepted_tokens > 0  # drafts were accepted, from cached MTP KV too
    assert got == expected


def test_with_an_mtp_layer_a_page_is_shared_only_with_the_token_after_it():
    from disaggsdk.engine.speculative.config import SpeculativeConfig

    config = EngineConfig(page_size=4, num_pages=64, speculative=SpeculativeConfig("mtp", 1))
    first = list(range(10, 30))  # 5 pages of 4
    with LLMEngine("deepseek-r1-tiny", config) as engine:
        engine.generate([first], GREEDY)
        # the same first 12 tokens, then another token: page 2's MTP KV read token 12 of the first
        # prompt, so only pages 0 and 1 may be shared
        second = engine.generate([first[:12] + [99] + first[13:]], GREEDY)[0]
        same = engine.generate([first[:13] + [99, 98]], GREEDY)[0]
    assert second.num_cached_tokens == 8 and same.num_cached_tokens == 12
