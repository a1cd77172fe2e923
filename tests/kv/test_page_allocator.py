"""Page allocator: allocate/free balance, pins, grant generations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsdk.kv.page_allocator import OutOfPagesError, PageAllocator, PageOwnershipError


def test_allocate_free_roundtrip():
    a = PageAllocator(8)
    g1 = a.allocate("r1", 3)
    g2 = a.allocate("r1", 2)
    assert a.page_ids("r1") == list(g1.page_ids + g2.page_ids)
    assert g1.generation != g2.generation
    assert a.num_free_pages == 3
    assert a.free("r1") == 5
    assert a.num_free_pages == 8
    assert a.free("r1") == 0  # a duplicate free is harmless


def test_out_of_pages_allocates_nothing():
    a = PageAllocator(4)
    a.allocate("r1", 3)
    assert not a.can_allocate(2)
    with pytest.raises(OutOfPagesError, match="1 of 4 are free"):
        a.allocate("r2", 2)
    assert a.num_free_pages == 1 and a.page_ids("r2") == []


def test_grant_goes_stale_when_pages_are_reused():
    a = PageAllocator(2)
    old = a.allocate("r1", 2)
    assert a.is_current(old)
    a.free("r1")
    assert not a.is_current(old)
    new = a.allocate("r2", 2)
    assert set(new.page_ids) == set(old.page_ids)
    assert not a.is_current(old) and a.is_current(new)


def test_pins():
    a = PageAllocator(4)
    a.allocate("r1", 1, pinned=True)
    a.allocate("r2", 1)
    assert a.is_pinned("r1") and not a.is_pinned("r2")
    a.unpin("r1")
    assert not a.is_pinned("r1")
    a.pin("r2")
    assert a.is_pinned("r2")
    a.free("r2")
    assert not a.is_pinned("r2")
    with pytest.raises(PageOwnershipError):
        a.pin("nobody")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.booleans()), max_size=40))
def test_pages_are_never_shared_and_always_return(ops):
    a = PageAllocator(10)
    for owner, n, do_free in ops:
        name = f"r{owner}"
        if do_free:
            a.free(name)
        elif a.can_allocate(n):
            a.allocate(name, n)
        held = [p for o in a.owners() for p in a.page_ids(o)]
        assert len(held) == len(set(held))
        assert len(held) + a.num_free_pages == 10
    for o in a.owners():
        a.free(o)
    assert a.num_free_pages == 10
