"""Prefix caching across prefill and decode (real units, real libfabric): under a multi-turn load
with a small KV pool (cached pages are evicted and reused), greedy tokens equal an uncached
colocated engine's, the decode unit asks prefill only for the pages it lacks, and fewer bytes move."""

from __future__ import annotations

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.serve.backends.local import serve_locally  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402
from tests.multi_turn_prompts import conversations as multi_turn  # noqa: E402

MODEL = "qwen3-coder-tiny"
PARAMS = SamplingParams(max_tokens=5, ignore_eos=True)
NUM_PAGES = 32  # of 4 tokens: the ~45 pages the conversations' prompts fill do not fit, so pages are evicted


def conversations() -> list[list[list[int]]]:
    """Three conversations of three turns sharing a 38-token system prompt (`tests.multi_turn_prompts`)."""
    return multi_turn(3, 3, seed=1, system_len=38, user_len=8, reply_len=6)


@pytest.fixture(scope="module")
def reference():
    convs = conversations()
    prompts = [p for k in range(3) for p in (c[k] for c in convs)]
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=256, prefix_caching=False)) as engine:
        return convs, [o.output_ids for o in engine.generate(prompts, PARAMS)]


def run(spec, convs):
    """Each turn of every conversation at once, turn after turn; tokens in turn-major order, and stats."""
    before = live_descendants()
    tokens, cached = [], []
    with serve_locally(spec, on_event=lambda _line: None) as rt:
        for k in range(len(convs[0])):
            # a request aborted at once, sharing this turn's prefix: its pages go back, shared or not
            rt.submit(f"aborted-{k}", convs[0][k] + [7, 7, 7], SamplingParams(max_tokens=10, ignore_eos=True),
                      lambda _event: None)
            rt.abort_sync(f"aborted-{k}")
            events = rt.generate_batch([c[k] for c in convs], PARAMS, timeout_s=120)
            assert all(ev[-1].finish_reason == "length" for ev in events), [ev[-1].error for ev in events]
            tokens += [[t for e in ev for t in e.new_token_ids] for ev in events]
            cached += [ev[-1].num_cached_tokens for ev in events]
        stats = rt.unit_stats()
    assert live_descendants() <= before, "a unit or tp worker outlived close()"
    assert all(s.num_free_pages == s.num_pages for s in stats.values())  # free or evictable: no page leaked
    # nothing retried or refused; the prefill unit counts a job aborted mid-transfer as failed
    assert sum(s.counters.requests_retried for s in stats.values()) == 0
    assert not any(s.counters.rejected_requests for s in stats.values())
    assert sum(s.counters.transfer_failures for s in stats.values()) <= len(convs[0])
    return tokens, stats, cached


def sent_bytes(stats) -> int:
    return sum(s.counters.transfer_bytes for s in stats.values() if s.role == "prefill")


def test_cached_and_uncached_deployments_give_the_same_tokens_and_the_cache_sends_less(reference):
    convs, expected = reference
    spec = make_spec(MODEL, num_pages=NUM_PAGES, budget=16)
    cached_tokens, cached, usage = run(spec, convs)
    plain_tokens, plain, plain_usage = run(attrs.evolve(spec, engine=attrs.evolve(spec.engine, prefix_caching=False)),
                                           convs)
    assert cached_tokens == expected and plain_tokens == expected
    assert sent_bytes(cached) < 0.6 * sent_bytes(plain)
    assert sum(s.counters.prefilled_locally for s in cached.values()) == 0
    decode, prefill = cached["decode-0"], cached["prefill-0"]
    assert decode.counters.pages_not_sent > 0 and decode.counters.bytes_not_sent > 0 and decode.counters.prefix_cache_hits > 0
    assert prefill.counters.prefix_cache_hits > 0  # the prefill unit computed only suffixes too
    assert all(n > 0 for n in usage[3:]) and not any(plain_usage)  # later turns report cached prompt tokens


def test_reset_prefix_cache_empties_every_units_cache_and_routing():
    """`Router.reset_prefix_cache` (POST /reset_prefix_cache): both units free every page nobody
    holds, the router and the decode unit forget where prefixes went, and the prompt that hit
    before is computed whole again (over real units)."""
    prompt = conversations()[0][1]
    with serve_locally(make_spec(MODEL, num_pages=NUM_PAGES), on_event=lambda _line: None) as rt:
        runs = [rt.generate_batch([prompt], PARAMS, timeout_s=60)[0] for _ in range(2)]
        assert runs[0][-1].num_cached_tokens == 0 and runs[1][-1].num_cached_tokens > 0
        assert rt.reset_prefix_cache() == {"prefill-0": NUM_PAGES, "decode-0": NUM_PAGES}
        with rt._lock:
            assert not any(rt.routing.policy.index._pages.values())  # the router forgot what it sent
        again = rt.generate_batch([prompt], PARAMS, timeout_s=60)[0]
        assert again[-1].num_cached_tokens == 0
        assert [t for e in again for t in e.new_token_ids] == [t for e in runs[0] for t in e.new_token_ids]


@pytest.mark.parametrize("provider,prefill_tp,decode_tp", [("tcp", 1, 1), ("shm", 2, 1),
                                                                pytest.param("tcp", 1, 2, marks=pytest.mark.slow)])
def test_prefix_cached_tokens_over_tcp_and_tp_mixes(reference, provider, prefill_tp, decode_tp):
    convs, expected = reference
    spec = make_spec(MODEL, prefill_tp=prefill_tp, decode_tp=decode_tp, provider=provider, num_pages=NUM_PAGES,
                     budget=16)
    tokens, stats, _ = run(spec, convs)
    assert tokens == expected
    assert sum(s.counters.pages_not_sent for s in stats.values()) > 0


def test_mtp_drafting_with_prefix_caching_across_prefill_and_decode():
    """DeepSeek's MTP layer: the prefill unit streams its KV as one more layer, both sides key pages
    one token further (the MTP KV at a page's end read the next token); drafts are accepted and the
    tokens equal plain uncached decoding."""
    from disaggsdk.spec.engine_settings import Speculative

    convs = conversations()
    prompts = [p for k in range(3) for p in (c[k] for c in convs)]
    with LLMEngine("deepseek-r1-tiny", EngineConfig(page_size=4, num_pages=256, prefix_caching=False)) as engine:
        expected = [o.output_ids for o in engine.generate(prompts, PARAMS)]
    spec = make_spec("deepseek-r1-tiny", num_pages=NUM_PAGES, budget=16)
    spec = attrs.evolve(spec, speculative=Speculative(method="mtp", num_tokens=1))
    tokens, stats, usage = run(spec, convs)
    assert tokens == expected
    assert sum(s.counters.spec_num_accepted_tokens for s in stats.values()) > 0
    assert sum(s.counters.pages_not_sent for s in stats.values()) > 0 and any(usage)


@pytest.mark.parametrize("model", [MODEL, pytest.param("deepseek-r1-tiny", marks=pytest.mark.slow)])
def test_short_suffixes_prefilled_on_decode_give_the_same_tokens(model):
    """`transfer.max_local_prefill_tokens` (conditional disaggregation): later turns, whose new
    tokens after decode's cached history are few, are prefilled on the decode unit with no transfer;
    first turns still go to the prefill unit; tokens equal plain uncached decoding (with MTP drafting
    on DeepSeek, drafts accepted)."""
    from disaggsdk.spec.engine_settings import Speculative

    convs = conversations()
    prompts = [p for k in range(3) for p in (c[k] for c in convs)]
    with LLMEngine(model, EngineConfig(page_size=4, num_pages=256, prefix_caching=False)) as engine:
        expected = [o.output_ids for o in engine.generate(prompts, PARAMS)]
    spec = make_spec(model, num_pages=NUM_PAGES, budget=16)
    spec = attrs.evolve(spec, transfer=attrs.evolve(spec.transfer, max_local_prefill_tokens=20))
    if model != MODEL:
        spec = attrs.evolve(spec, speculative=Speculative(method="mtp", num_tokens=1))
    tokens, stats, usage = run(spec, convs)
    assert tokens == expected
    decode, prefill = stats["decode-0"], stats["prefill-0"]
    assert decode.counters.requests_prefilled_short > 0
    assert decode.counters.prefilled_locally == decode.counters.requests_prefilled_short
    assert prefill.counters.transfer_bytes > 0  # the first turns (38 + 8 new tokens) still went to prefill
    assert decode.counters.prefix_cache_hits > 0 and any(usage[3:])
    if model != MODEL:
        assert sum(s.counters.spec_num_accepted_tokens for s in stats.values()) > 0
