"""Prefix-affine routing, pure: the index of what went where, and the two policies over it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disaggsdk.kv.block_hash import page_hashes
from disaggsdk.messenger.prefix_affinity import PrefixIndex, RoutingPolicy

PAGE = 4
UNITS = ["decode-0", "decode-1", "decode-2"]


def hashes_of(tokens: list[int]) -> list[bytes]:
    return page_hashes(tokens, PAGE)


SYSTEM = list(range(100, 132))  # 8 pages both prompts below share


def old_rule(candidates, load):
    """The router's rule before prefix caching: fewest in flight, ties by name."""
    return min(candidates, key=lambda n: (load.get(n, 0), n))


# least_loaded


def test_least_loaded_is_the_old_rule_even_where_a_prefix_was_seen():
    policy = RoutingPolicy("least_loaded")
    prompt = hashes_of(SYSTEM)
    policy.routed("decode-1", prompt)
    assert policy.choose(UNITS, prompt, {"decode-0": 0, "decode-1": 0}) == "decode-0"  # by name
    assert policy.choose(UNITS, prompt, {"decode-0": 2, "decode-1": 1, "decode-2": 1}) == "decode-1"
    assert policy.choose(list(reversed(UNITS)), [], {"decode-0": 1}) == "decode-1"  # missing load: 0


# cache_aware


def test_a_repeated_prefix_goes_back_to_the_unit_that_was_sent_it():
    policy = RoutingPolicy("cache_aware")
    first = hashes_of(SYSTEM + [1, 2, 3, 4])
    assert policy.choose(UNITS, first, {}) == "decode-0" and policy.last_matched_pages == 0
    policy.routed("decode-0", first)
    second = hashes_of(SYSTEM + [9, 9, 9, 9, 9])
    # decode-0 still holds the first request; its 8 shared pages outweigh that one request
    assert policy.choose(UNITS, second, {"decode-0": 1}) == "decode-0"
    assert (policy.last.matched_pages, policy.last.prompt_pages) == (8, 9)
    unrelated = hashes_of(list(range(500, 540)))
    assert policy.choose(UNITS, unrelated, {"decode-0": 1}) == "decode-1"  # nothing seen: least busy


def test_an_overloaded_unit_loses_its_prefix_to_a_less_busy_one():
    policy = RoutingPolicy("cache_aware")
    prompt = hashes_of(SYSTEM)
    policy.routed("decode-1", prompt)
    assert policy.choose(UNITS, prompt, {"decode-1": 1}) == "decode-1"  # full hit outweighs 1 request
    assert policy.choose(UNITS, prompt, {"decode-1": 2}) == "decode-0"  # a tie at 2: the less busy
    assert policy.choose(UNITS, prompt, {"decode-1": 5}) == "decode-0"
    assert policy.last_matched_pages == 0
    # a higher overlap weight keeps the prefix together longer
    patient = RoutingPolicy("cache_aware", policy.index, overlap_weight=4)
    assert patient.choose(UNITS, prompt, {"decode-1": 4}) == "decode-1"


def test_a_partial_hit_outweighs_less_load_than_a_full_one():
    policy = RoutingPolicy("cache_aware")
    policy.routed("decode-2", hashes_of(SYSTEM[:16]))  # half of the prompt's 8 pages
    prompt = hashes_of(SYSTEM)
    assert policy.choose(UNITS, prompt, {}) == "decode-2" and policy.last_matched_pages == 4
    assert policy.choose(UNITS, prompt, {"decode-2": 1}) == "decode-0"  # 4 + (8 + 4) ties 8 + 8: less busy


def test_without_any_overlap_cache_aware_chooses_as_least_loaded():
    cache_aware, least_loaded = RoutingPolicy("cache_aware"), RoutingPolicy("least_loaded")
    cache_aware.routed("decode-2", hashes_of([7] * 40))
    for load in ({}, {"decode-0": 3, "decode-1": 1}, {"decode-0": 1, "decode-1": 1, "decode-2": 0}):
        prompt = hashes_of(SYSTEM)
        assert cache_aware.choose(UNITS, prompt, load) == least_loaded.choose(UNITS, prompt, load)
        assert cache_aware.choose(UNITS, [], load) == old_rule(UNITS, load)  # shorter than a page


def test_a_forgotten_unit_is_no_longer_preferred():
    policy = RoutingPolicy("cache_aware")
    prompt = hashes_of(SYSTEM)
    policy.routed("decode-2", prompt)
    assert policy.choose(UNITS, prompt, {}) == "decode-2"
    policy.forget("decode-2")
    assert policy.choose(UNITS, prompt, {}) == "decode-0" and policy.index.num_pages("decode-2") == 0


def test_unknown_policy_and_empty_candidates_are_refused():
    with pytest.raises(ValueError, match="cache_aware, least_loaded"):
        RoutingPolicy("round_robin")
    with pytest.raises(ValueError, match="no candidate"):
        RoutingPolicy("cache_aware").choose([], [], {})


# the index


def test_the_index_evicts_the_least_recently_routed_pages_first():
    index = PrefixIndex(capacity_pages=4)
    a, b, c = hashes_of([1] * 8), hashes_of([2] * 8), hashes_of([3] * 8)
    index.add("u", a)
    index.add("u", b)
    assert (index.matched_pages("u", a), index.matched_pages("u", b)) == (2, 2)
    index.add("u", c)  # over capacity: a, the oldest, goes
    assert [index.matched_pages("u", h) for h in (a, b, c)] == [0, 2, 2]
    index.add("u", b)  # b is now the most recent; the next prompt evicts c
    index.add("u", a)
    assert [index.matched_pages("u", h) for h in (a, b, c)] == [2, 2, 0]
    assert index.num_pages("u") == 4 and index.matched_pages("other", a) == 0


def test_eviction_takes_an_old_prompts_tail_before_its_prefix():
    index = PrefixIndex(capacity_pages=6)
    long = hashes_of(SYSTEM[:20])  # 5 pages
    index.add("u", long)
    index.add("u", hashes_of([9] * 8))  # 2 pages: the long prompt's last page goes
    assert index.matched_pages("u", long) == 4
    index.set_capacity("u", 3)  # shrinking evicts at once, tails first
    assert index.matched_pages("u", long) == 1 and index.num_pages("u") == 3


def test_matching_stops_at_the_first_page_not_sent():
    index = PrefixIndex(capacity_pages=100)
    index.add("u", hashes_of(SYSTEM[:8]))
    assert index.matched_pages("u", hashes_of(SYSTEM)) == 2
    assert index.matched_pages("u", hashes_of([0] + SYSTEM)) == 0  # another first token: nothing shared


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity_pages"):
        PrefixIndex(0)
    with pytest.raises(ValueError, match="capacity_pages"):
        PrefixIndex(4).set_capacity("u", 0)


# properties

names = st.lists(st.sampled_from(UNITS + ["prefill-0", "mixed-0"]), min_size=1, max_size=5, unique=True)
loads = st.dictionaries(st.sampled_from(UNITS + ["prefill-0", "mixed-0"]), st.integers(0, 50), max_size=5)
prompts = st.lists(st.integers(0, 3), max_size=24)  # a tiny vocabulary: prefixes are shared often
history = st.lists(st.tuples(st.sampled_from(UNITS), prompts), max_size=8)


@given(names, prompts, loads, history, st.sampled_from(["cache_aware", "least_loaded"]))
def test_the_choice_is_a_candidate_and_least_loaded_picks_a_minimum_load(candidates, prompt, load, seen, name):
    policy = RoutingPolicy(name, capacity_pages=8)
    for unit, tokens in seen:
        policy.routed(unit, hashes_of(tokens))
    target = policy.choose(candidates, hashes_of(prompt), load)
    assert target in candidates and policy.last.target == target
    assert 0 <= policy.last_matched_pages <= len(hashes_of(prompt))
    if name == "least_loaded":
        assert load.get(target, 0) == min(load.get(c, 0) for c in candidates)
        assert target == old_rule(candidates, load)
