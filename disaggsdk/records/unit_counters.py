"""The one declaration of an engine's cumulative counters: what a unit sends, the router keeps,
/metrics exports, the live views and `generate --spec` read.

Each field names its own Prometheus series (`counter`, `by_reason`, `by_tier`, `per_position`) and its help
text, so adding a counter is its declaration here and the line of its producer that counts it:
the unit's stats frame carries the record as it is, /metrics walks its fields
(`serve.engine_metrics`), and an older peer reads a frame with a field it does not know, because
msgspec ignores unknown fields and fills missing ones with their defaults (no protocol bump).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Annotated

import msgspec

from disaggsdk.records.request_transfer import RequestTransfer


class SeriesKind(Enum):
    """How one field becomes Prometheus samples."""

    COUNTER = "counter"  # one sample per engine
    BY_REASON = "by_reason"  # a ``dict[str, int]``: one sample per engine and reason
    BY_TIER = "by_tier"  # a ``dict[str, int | float]``: one sample per engine and KV tier (host, disk, store)
    PER_POSITION = "per_position"  # a ``list[int]``: one sample per engine and position


@dataclass(frozen=True)
class Series:
    """The Prometheus series one field of `UnitCounters` is exported as (``_total`` is added)."""

    attribute: str
    metric: str  # without the ``disaggsdk_`` prefix and the ``_total`` suffix
    help: str
    kind: SeriesKind


def counter(metric: str, help: str) -> msgspec.Meta:
    """The field is a counter, exported as ``disaggsdk_<metric>_total{engine, role}``."""
    return msgspec.Meta(description=help, extra={"metric": metric, "kind": SeriesKind.COUNTER.value})


def by_reason(metric: str, help: str) -> msgspec.Meta:
    """The field counts by reason (``dict[str, int]``): ``disaggsdk_<metric>_total{..., reason}``."""
    return msgspec.Meta(description=help, extra={"metric": metric, "kind": SeriesKind.BY_REASON.value})


def by_tier(metric: str, help: str) -> msgspec.Meta:
    """The field counts by KV tier (``dict[str, int | float]``): ``disaggsdk_<metric>_total{..., tier}``."""
    return msgspec.Meta(description=help, extra={"metric": metric, "kind": SeriesKind.BY_TIER.value})


def per_position(metric: str, help: str) -> msgspec.Meta:
    """The field counts by draft position (``list[int]``): ``disaggsdk_<metric>_total{..., position}``."""
    return msgspec.Meta(description=help, extra={"metric": metric, "kind": SeriesKind.PER_POSITION.value})


class UnitCounters(msgspec.Struct, kw_only=True):
    """One engine's counters since it started. Mutable: the messenger counts into its own record;
    a unit's stats frame carries a copy with the engine's counters filled in."""

    # the KV handoff (the messenger)
    transfer_bytes: Annotated[int, counter(
        "kv_transfer_bytes", "KV bytes written from this prefill engine to decode engines.")] = 0
    transfer_writes: Annotated[int, counter(
        "kv_transfer_writes", "KV page writes issued by this prefill engine.")] = 0
    transfer_s: Annotated[float, counter(
        "kv_transfer_seconds", "Time spent writing KV, first write submitted to last completed.")] = 0.0
    exposed_transfer_s: Annotated[float, counter(
        "kv_exposed_transfer_seconds",
        "KV transfer time not hidden behind the prefill forward pass (measured on decode engines).")] = 0.0
    transfer_failures: Annotated[int, counter(
        "kv_transfer_failures", "KV handoff attempts that failed.")] = 0
    requests_retried: Annotated[int, counter(
        "requests_retried", "Requests re-sent to another prefill engine.")] = 0
    prefilled_locally: Annotated[int, counter(
        "requests_prefilled_locally",
        "Requests a decode engine prefilled itself (no prefill engine answered, or few tokens were missing).")] = 0
    requests_transferred: int = 0  # requests whose handoff finished here (read by the benchmark's records only)
    # decode: prompt pages (of every layer and rank) its prefix cache held, so nobody sent them,
    # their bytes, and requests whose whole prompt was cached (no prefill at all)
    pages_not_sent: Annotated[int, counter(
        "kv_not_sent_pages",
        "KV pages (of every layer and rank) a decode engine's prefix cache held, so no prefill engine sent them.")] = 0
    bytes_not_sent: Annotated[int, counter(
        "kv_not_sent_bytes", "KV bytes a decode engine's prefix cache spared the transfer.")] = 0
    requests_fully_cached: Annotated[int, counter(
        "requests_fully_cached", "Requests whose whole prompt a decode engine had cached: no prefill at all.")] = 0
    requests_prefilled_short: Annotated[int, counter(
        "requests_prefilled_short",
        "Requests a decode engine prefilled itself because few of their prompt tokens were missing from its "
        "cache (transfer.max_local_prefill_tokens).")] = 0
    kv_pages_failed_verification: Annotated[int, counter(
        "kv_pages_failed_verification",
        "KV handoff attempts whose pages did not match the prefill engine's digest (transport.verify_pages): "
        "forged or corrupted writes, retried and never used.")] = 0
    rejected_frames: Annotated[dict[str, int], by_reason(
        "control_frames_rejected", "Control frames dropped, by reason (bad MAC, replayed, ...).")] = {}
    rejected_requests: Annotated[dict[str, int], by_reason(
        "prefill_requests_rejected", "Prefill requests refused by a prefill engine, by reason.")] = {}
    # KV migration between decode engines (messenger.kv_migration)
    requests_moved_out: Annotated[int, counter(
        "requests_moved_out", "Decoding requests this engine handed to another decode engine with their KV.")] = 0
    requests_moved_in: Annotated[int, counter(
        "requests_moved_in", "Decoding requests this engine continued with KV another decode engine sent.")] = 0
    moves_failed: Annotated[int, counter(
        "request_moves_failed",
        "Moves of a decoding request that did not happen (refused, target down, aborted); it went on here.")] = 0
    moved_out_bytes: Annotated[int, counter(
        "kv_moved_out_bytes", "KV bytes this decode engine wrote to another for moved requests.")] = 0
    moved_in_bytes: Annotated[int, counter(
        "kv_moved_in_bytes", "KV bytes of the requests this decode engine took over (every write landed).")] = 0
    # the engine's scheduler
    num_preemptions: Annotated[int, counter(
        "num_preemptions", "Requests preempted by the engine (pages taken back, recomputed later).")] = 0
    prefix_cache_queries: Annotated[int, counter(
        "prefix_cache_queries", "Prefix cache queries, in prompt tokens looked up.")] = 0
    prefix_cache_hits: Annotated[int, counter(
        "prefix_cache_hits", "Prefix cache hits, in prompt tokens found cached.")] = 0
    # the KV tiers below the prefix cache (kv.tiers; docs/kv_tiers.md): all zero without them
    external_prefix_cache_hits: Annotated[int, counter(
        "external_prefix_cache_hits",
        "Prompt tokens loaded from a KV tier (host, disk or store) instead of computed; part of prefix_cache_hits.")] = 0
    kv_tier_hit_pages: Annotated[dict[str, int], by_tier(
        "kv_tier_hit_pages", "KV pages found in each tier and loaded.")] = {}
    kv_tier_read_bytes: Annotated[dict[str, int], by_tier(
        "kv_tier_read_bytes", "Bytes read from each KV tier.")] = {}
    kv_tier_written_bytes: Annotated[dict[str, int], by_tier(
        "kv_tier_written_bytes", "Bytes written to each KV tier.")] = {}
    kv_tier_evictions: Annotated[dict[str, int], by_tier(
        "kv_tier_evictions", "Pages each KV tier evicted to make room (least recently used first).")] = {}
    kv_tier_corrupt_pages: Annotated[dict[str, int], by_tier(
        "kv_tier_corrupt_pages", "Pages read back from each tier that failed their checks: discarded and recomputed.")] = {}
    kv_tier_errors: Annotated[dict[str, int], by_tier(
        "kv_tier_errors", "Reads or writes a tier could not do (disk error, store unreachable): misses, not failures.")] = {}
    kv_tier_dropped_writes: Annotated[dict[str, int], by_tier(
        "kv_tier_dropped_writes", "Pages not written to a tier because its write queue was full.")] = {}
    kv_tier_load_seconds: Annotated[float, counter(
        "kv_tier_load_seconds", "Time the engine spent loading pages from the KV tiers.")] = 0.0
    # speculative decoding (engine.speculative.stats.SpecStats): all zero without it
    spec_num_drafts: Annotated[int, counter(
        "spec_decode_num_drafts", "Verify steps that carried draft tokens.")] = 0
    spec_num_draft_tokens: Annotated[int, counter(
        "spec_decode_num_draft_tokens", "Draft tokens proposed.")] = 0
    spec_num_accepted_tokens: Annotated[int, counter(
        "spec_decode_num_accepted_tokens", "Draft tokens accepted.")] = 0
    spec_accepted_per_position: Annotated[list[int], per_position(
        "spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted, by position in the draft.")] = []
    spec_drafts_per_position: list[int] = []  # drafts that reached each position (the live view's acceptance)
    # expert parallelism (engine.expert_parallel, engine.dp_lockstep): all zero without it
    expert_all_to_all_bytes: Annotated[int, counter(
        "expert_all_to_all_bytes",
        "Hidden-state bytes this engine's head rank sent to other ranks in MoE dispatch and combine.")] = 0
    expert_all_to_all_seconds: Annotated[float, counter(
        "expert_all_to_all_seconds",
        "Time the head rank spent inside MoE all-to-all collectives, waiting for the other ranks included.")] = 0.0
    dp_idle_steps: Annotated[int, counter(
        "dp_idle_steps",
        "Steps a lock-step dp rank ran with an empty batch because another rank of its group had work.")] = 0

    def count_transfer(self, record: RequestTransfer) -> None:
        """Count one request whose handoff finished (either side's record)."""
        self.requests_transferred += 1
        self.transfer_bytes += record.bytes
        self.transfer_writes += record.writes
        self.transfer_s += record.transfer_s
        self.exposed_transfer_s += record.exposed_s

    def count_not_sent(self, num_pages: int, num_bytes: int) -> None:
        """Count prompt pages a decode engine's prefix cache held (they did not move)."""
        self.pages_not_sent += num_pages
        self.bytes_not_sent += num_bytes

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache / looked up, 0..1; None before any lookup."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else None


def exported_series(record_type: type[UnitCounters] = UnitCounters) -> Iterator[Series]:
    """The Prometheus series of ``record_type``'s fields, in declaration order; a field declared
    without `counter` / `by_reason` / `per_position` is not exported."""
    info = msgspec.inspect.type_info(record_type)
    assert isinstance(info, msgspec.inspect.StructType)
    for f in info.fields:
        meta = f.type
        if isinstance(meta, msgspec.inspect.Metadata) and meta.extra and "metric" in meta.extra:
            help_text = (meta.extra_json_schema or {}).get("description", "")
            yield Series(f.name, meta.extra["metric"], help_text, SeriesKind(meta.extra["kind"]))
