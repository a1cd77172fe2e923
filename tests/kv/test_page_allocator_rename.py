"""`PageAllocator.rename`: a retried request's pages change owner, keeping generation and pin."""

from __future__ import annotations

import pytest

from disaggsdk.kv.page_allocator import PageAllocator, PageOwnershipError


def test_rename_moves_pages_generation_and_pin():
    alloc = PageAllocator(8)
    grant = alloc.allocate("r", 3, pinned=True)
    assert alloc.rename("r", "r\x00q1") == 3
    assert alloc.page_ids("r") == [] and alloc.page_ids("r\x00q1") == list(grant.page_ids)
    assert alloc.is_pinned("r\x00q1") and not alloc.is_pinned("r")
    fresh = alloc.allocate("r", 2, pinned=True)  # the request gets new pages, the old stay parked
    assert not set(fresh.page_ids) & set(grant.page_ids) and alloc.num_free_pages == 3
    assert alloc.free("r\x00q1") == 3 and alloc.num_free_pages == 6
    assert alloc.rename("unknown", "x") == 0
    with pytest.raises(PageOwnershipError, match="already holds"):
        alloc.rename("r", "r")
