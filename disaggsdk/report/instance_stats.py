"""What one instance reports about itself: the measured record /metrics and the live views read.

A plain record, filled by whoever runs the instance (the in-process backend, the router over a
`Runtime`); report only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class InstanceStats:
    """A snapshot of one instance, for /metrics and the live views. Counters are cumulative."""

    name: str
    role: str  # "prefill" | "decode" | "mixed"
    healthy: bool = True
    running: int = 0
    waiting: int = 0
    kv_pages_used: int = 0
    kv_pages_total: int = 0
    transfer_bytes: int = 0
    transfer_writes: int = 0
    transfer_s: float = 0.0
    exposed_transfer_s: float = 0.0
    transfer_failures: int = 0
    requests_retried: int = 0
    rejected_frames: dict[str, int] = field(default_factory=dict)  # control frames dropped, by reason
    rejected_requests: dict[str, int] = field(default_factory=dict)  # prefill requests refused, by reason
    # speculative decoding, cumulative (vLLM's spec_decode counters)
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] = field(default_factory=list)
    spec_drafts_per_position: list[int] = field(default_factory=list)
    # prefix caching, cumulative: prompt tokens looked up / found cached (vLLM's prefix_cache_queries
    # and _hits); decode: prompt pages and bytes its cache held so nobody sent them, and requests
    # whose whole prompt was cached there (no prefill at all), or short enough after it to be
    # prefilled there (transfer.max_local_prefill_tokens)
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    pages_not_sent: int = 0
    bytes_not_sent: int = 0
    requests_fully_cached: int = 0
    requests_prefilled_short: int = 0
    # decode, with transport.verify_pages: handoff attempts whose pages did not match prefill's
    # digest (forged or corrupted writes); each was retried, its pages never used or cached
    kv_pages_failed_verification: int = 0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV pages in use, 0..1 (vLLM's ``kv_cache_usage_perc``); 0 without a pool."""
        return self.kv_pages_used / self.kv_pages_total if self.kv_pages_total else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache / looked up, 0..1; None before any lookup."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None
