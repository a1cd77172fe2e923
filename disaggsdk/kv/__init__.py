"""The KV page in one home: who holds which page, which pages a prompt can share, how a page is laid
out, and the memory each rank's pool lives in.

- `page_allocator`: the free list, per-owner pages, pins and grant generations (pure Python: the
  messenger grants the same page ids to remote writers);
- `block_hash`, `page_cache`, `prefix_cache`: chained page hashes, the hash <-> page index with its
  evictable pages, and an engine's prefix cache over its allocator;
- `layout`: torch views of a rank's pool, ``[num_layers][num_pages][page_bytes]`` (HND, NHD, MLA);
- `pools`: each rank's pool memory, shareable with its instance's head: the host (memfd) and CUDA
  (cuMem) twins behind one `pools.base.RankPool` contract and registry, the fd hand-over, host mirrors.

Pages are counted for planning in `disaggsdk.plan.pages` (pure, below this package); a unit's pools
as its transport registers them are `disaggsdk.launch.kv_registration` (above the transport).
"""
