"""A unit's `UnitStats` message as the `InstanceStats` snapshot /metrics and the live views read."""

from __future__ import annotations

from disaggsdk.launch import messages as ch
from disaggsdk.report.instance_stats import InstanceStats


def instance_stats(name: str, role: str, healthy: bool, s: ch.UnitStats | None) -> InstanceStats:
    """One unit's gauges; zeros for a unit without a snapshot (not answered yet, or dead)."""
    if s is None:
        return InstanceStats(name=name, role=role, healthy=healthy, running=0, waiting=0, kv_pages_used=0,
                             kv_pages_total=0, transfer_bytes=0, transfer_writes=0, transfer_s=0.0,
                             exposed_transfer_s=0.0, transfer_failures=0, requests_retried=0,
                             extra={"prefilled_locally": 0.0, "rejected_frames": 0.0, "num_preemptions": 0.0})
    return InstanceStats(
        name=name, role=role, healthy=healthy, running=s.running, waiting=s.waiting,
        kv_pages_used=s.num_pages - s.num_free_pages, kv_pages_total=s.num_pages,
        transfer_bytes=s.transfer_bytes, transfer_writes=s.transfer_writes, transfer_s=s.transfer_s,
        exposed_transfer_s=s.exposed_transfer_s, transfer_failures=s.transfer_failures,
        requests_retried=s.requests_retried, rejected_frames=dict(s.rejected_frames),
        rejected_requests=dict(s.rejected_requests),
        extra={"prefilled_locally": float(s.prefilled_locally), "rejected_frames": float(sum(s.rejected_frames.values())),
               "num_preemptions": float(s.num_preemptions)},
        spec_num_drafts=s.spec_num_drafts, spec_num_draft_tokens=s.spec_num_draft_tokens,
        spec_num_accepted_tokens=s.spec_num_accepted_tokens,
        spec_accepted_per_position=list(s.spec_accepted_per_position),
        spec_drafts_per_position=list(s.spec_drafts_per_position),
        prefix_cache_queries=s.prefix_cache_queries, prefix_cache_hits=s.prefix_cache_hits,
        pages_not_sent=s.pages_not_sent, bytes_not_sent=s.bytes_not_sent, requests_fully_cached=s.requests_fully_cached,
        requests_prefilled_short=s.requests_prefilled_short,
        kv_pages_failed_verification=s.kv_pages_failed_verification,
    )
