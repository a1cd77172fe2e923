"""KV tiers: where pages evicted from a unit's KV pool go, so a later prompt loads them instead of
computing them again. Fastest first: host memory (`host_tier`), a local disk (`disk_tier`), and a
store every instance reads (`store_tier`, Redis or Valkey); `tier_stack.TierStack` drives them.
Every entry carries its identity and a digest (`page_entry`) and is verified before it is loaded.
"""
