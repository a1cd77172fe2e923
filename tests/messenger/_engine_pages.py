"""The page contract of `LLMEngine` that the messengers use (its ``kv``, a `KVPort`), over a real
`PageAllocator` the tests look into: the part both sides' fake engines share."""

from __future__ import annotations

from disaggsdk.kv.page_allocator import PageAllocator, PageGrant


class EnginePages:
    """Pages as `LLMEngine.kv` hands them to a messenger (allocate, pin, check, rename, release).

    A fake engine subclasses it and is its own ``kv``: one object plays the engine and its port, so
    a test looks into both through one name.
    """

    def __init__(self, num_pages: int, page_size: int):
        self.allocator = PageAllocator(num_pages)
        self.page_size = page_size
        self.kv = self

    @property
    def num_free_pages(self) -> int:
        return self.allocator.num_free_pages

    def allocate_pages(self, request_id: str, num_tokens: int, pinned: bool = True) -> PageGrant:
        return self.allocator.allocate(request_id, -(-num_tokens // self.page_size), pinned=pinned)

    def holds_grant(self, grant: PageGrant) -> bool:
        return self.allocator.is_current(grant)

    def rename_pages(self, request_id: str, owner: str) -> int:
        return self.allocator.rename(request_id, owner)

    def pin_pages(self, request_id: str) -> None:
        self.allocator.pin(request_id)

    def release(self, request_id: str) -> int:
        return self.allocator.free(request_id)
