"""`PrefixCache` on its own, over a real page allocator: offer computed pages, find them again,
count queries and hits as vLLM does."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.engine.sequence import Request
from disaggsdk.kv.page_allocator import PageAllocator
from disaggsdk.kv.prefix_cache import PrefixCache

PAGE = 4


def computed_request(cache: PrefixCache, request_id: str, prompt: list[int]) -> Request:
    """A request whose prompt[:-1] is computed in its own pages, offered to the cache."""
    req = Request(request_id, prompt, SamplingParams(max_tokens=1))
    cache.allocator.allocate(request_id, -(-(len(prompt) - 1) // PAGE))
    req.num_computed_tokens = len(prompt) - 1
    return req


def test_offered_pages_are_found_shared_and_counted():
    cache = PrefixCache(PageAllocator(16), PAGE, enabled=True)
    prompt = list(range(11))  # prompt[:-1]: 10 tokens, two full pages
    first = computed_request(cache, "a", prompt)
    assert cache.cache_computed(first) == 2 and first.num_pages_cached == 2
    assert cache.cache_computed(first) == 0  # offered once
    assert cache.cached_pages(prompt) == 2 and (cache.queries, cache.hits) == (0, 0)  # a look counts nothing
    assert cache.share_prompt("b", prompt) == 2
    assert cache.allocator.page_ids("b") == cache.allocator.page_ids("a")[:2]
    assert (cache.queries, cache.hits) == (11, 8)
    other = [99, *prompt[1:]]  # the first page differs, so the chained second one does too
    assert cache.cached_pages(other) == 0


def test_a_new_request_takes_its_cached_prefix_and_counts_once():
    cache = PrefixCache(PageAllocator(16), PAGE, enabled=True)
    prompt = list(range(13))
    cache.cache_computed(computed_request(cache, "a", prompt))
    req = Request("b", prompt, SamplingParams(max_tokens=1))
    hit = cache.share_prefix(req, target_tokens=len(prompt))
    assert hit == 12 and req.num_computed_tokens == 12  # three pages; the last token is computed anyway
    cache.count_lookup(req, hit)
    assert (cache.queries, cache.hits, req.num_cached_tokens) == (13, 12, 12)
    req.num_preemptions = 1
    cache.count_lookup(req, hit)  # a recompute is not a new query
    assert (cache.queries, cache.hits) == (13, 12)
    scored = Request("c", prompt, SamplingParams(max_tokens=1, prompt_logprobs=0))
    assert cache.share_prefix(scored, target_tokens=len(prompt)) == 0  # every position is computed


def test_disabled_finds_and_offers_nothing():
    cache = PrefixCache(PageAllocator(16), PAGE, enabled=False)
    prompt = list(range(11))
    assert cache.cache_computed(computed_request(cache, "a", prompt)) == 0
    assert cache.cached_pages(prompt) == 0 and cache.share_prompt("b", prompt) == 0
    assert (cache.queries, cache.hits) == (0, 0)
