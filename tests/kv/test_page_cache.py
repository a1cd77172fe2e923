"""The prefix cache's page bookkeeping: chained hashes, shared pages, LRU eviction, generations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsdk.kv.block_hash import cacheable_tokens, extend_page_hashes, page_hashes
from disaggsdk.kv.page_allocator import PageAllocator, PageOwnershipError


def test_hashes_are_chained_over_full_pages():
    a = page_hashes(list(range(10)), 4)
    assert len(a) == 2 and all(len(h) == 16 for h in a)
    assert page_hashes(list(range(8)) + [99, 98], 4) == a  # a partial page gets no hash
    # the same second page after a different first page hashes differently
    assert page_hashes([7, 1, 2, 3] + [4, 5, 6, 7], 4)[1] != a[1]
    assert page_hashes(list(range(8)), 4, salt=b"lora-1") != a
    grown: list[bytes] = []
    extend_page_hashes(grown, list(range(4)), 4, 9)
    extend_page_hashes(grown, list(range(10)), 4, 9)
    assert grown == a


def test_cacheable_tokens_always_leave_one_to_compute():
    assert cacheable_tokens(16, 4) == 12
    assert cacheable_tokens(17, 4) == 16
    assert cacheable_tokens(1, 4) == 0


def test_shared_pages_stay_until_their_last_holder_then_become_evictable():
    alloc = PageAllocator(4)
    grant = alloc.allocate("a", 2)
    hashes = page_hashes(list(range(8)), 4)
    assert alloc.cache_pages(list(grant.page_ids), hashes) == 2
    assert alloc.lookup(hashes) == list(grant.page_ids)
    alloc.share("b", alloc.lookup(hashes[:1]))
    assert alloc.num_holders(grant.page_ids[0]) == 2
    alloc.free("a")
    assert alloc.num_free_pages == 3  # page 0 still held by b; page 1 evictable, still findable
    assert alloc.lookup(hashes) == list(grant.page_ids)
    alloc.free("b")
    assert alloc.num_free_pages == 4 and alloc.cache.num_evictable == 2


def test_eviction_takes_free_pages_first_then_the_least_recently_released_and_forgets_its_hash():
    alloc = PageAllocator(3)
    a, b = alloc.allocate("a", 1), alloc.allocate("b", 1)
    ha, hb = page_hashes([1] * 4, 4), page_hashes([2] * 4, 4)
    alloc.cache_pages(list(a.page_ids), ha)
    alloc.cache_pages(list(b.page_ids), hb)
    alloc.free("a")
    alloc.free("b")
    first = alloc.allocate("c", 1)  # the never-used page first
    assert first.page_ids[0] not in a.page_ids + b.page_ids
    reused = alloc.allocate("d", 1)  # then a's page: released before b's
    assert reused.page_ids == a.page_ids and reused.generation > a.generation
    assert alloc.lookup(ha) == [] and alloc.lookup(hb) == list(b.page_ids)
    assert alloc.cache.num_evictions == 1
    with pytest.raises(PageOwnershipError):
        alloc.share("e", list(a.page_ids))  # no longer cached: its content is d's now


def test_a_hash_cached_twice_keeps_the_first_page():
    alloc = PageAllocator(2)
    h = page_hashes([5] * 4, 4)
    a, b = alloc.allocate("a", 1), alloc.allocate("b", 1)
    assert alloc.cache_pages(list(a.page_ids), h) == 1
    assert alloc.cache_pages(list(b.page_ids), h) == 0
    alloc.free("b")
    assert alloc.cache.num_evictable == 0 and alloc.num_free_pages == 1  # b's copy went straight back
    assert alloc.reset_cache() == 0
    alloc.free("a")
    assert alloc.reset_cache() == 1 and alloc.lookup(h) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "share", "free", "cache"]), st.integers(0, 5),
                          st.integers(0, 3)), max_size=60))
def test_every_page_is_free_evictable_or_held(ops):
    alloc = PageAllocator(8)
    hashes = page_hashes(list(range(32)), 4)
    for op, owner_i, n in ops:
        owner = f"o{owner_i}"
        if op == "alloc" and alloc.can_allocate(n):
            alloc.allocate(owner, n)
        elif op == "share" and owner not in alloc.owners():
            alloc.share(owner, alloc.lookup(hashes[:n]))
        elif op == "free":
            alloc.free(owner)
        elif op == "cache":
            pages = alloc.page_ids(owner)
            alloc.cache_pages(pages, hashes[: len(pages)])
        held = {p for o in alloc.owners() for p in alloc.page_ids(o)}
        evictable = {p for p in range(8) if alloc.cache.is_evictable(p)}
        assert not held & evictable
        assert len(held) + alloc.num_free_pages == 8
        assert all(alloc.num_holders(p) == sum(p in alloc.page_ids(o) for o in alloc.owners()) for p in range(8))
        found = alloc.lookup(hashes)
        assert all(alloc.cache.is_cached(p) for p in found)
