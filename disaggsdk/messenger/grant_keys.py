"""Per-grant keys: a decode unit opens only the pages it granted to one attempt, and only until it ends."""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.write_plan import PoolGeometry

if TYPE_CHECKING:
    from disaggsdk.messenger.ports import Transport
    from disaggsdk.transfer import MemoryRegion, RegionDescriptor


def page_runs(geometry: PoolGeometry, page_ids: Sequence[int]) -> list[tuple[int, int]]:
    """The byte ranges ``(offset, length)`` of ``page_ids`` in every layer of a pool, consecutive
    pages merged, in pool order."""
    page_runs_: list[tuple[int, int]] = []  # (first page, number of pages)
    for p in sorted(page_ids):
        if page_runs_ and page_runs_[-1][0] + page_runs_[-1][1] == p:
            page_runs_[-1] = (page_runs_[-1][0], page_runs_[-1][1] + 1)
        else:
            page_runs_.append((p, 1))
    return [(geometry.page_offset(layer, first), count * geometry.page_bytes)
            for layer in range(geometry.num_layers) for first, count in page_runs_]


@dataclass
class GrantKeys:
    """The registrations that open one attempt's pages and context slot (decode side)."""

    registrations: list[MemoryRegion] = field(default_factory=list)
    segments: list[list[pr.GrantSegment]] = field(default_factory=list)  # per decode tp rank
    context: pr.GrantSegment | None = None

    def revoke(self, transfer: Transport) -> None:
        """Deregister every key of the grant: from now on its writes land nowhere. Idempotent."""
        for region in self.registrations:
            transfer.deregister(region)
        self.registrations = []


def open_grant(transfer: Transport, pools: Sequence[MemoryRegion], geometry: PoolGeometry,
               page_ids: Sequence[int], context: MemoryRegion | None, slot_offset_bytes: int = 0,
               slot_bytes: int = 0) -> GrantKeys:
    """Register ``page_ids`` of every rank's pool and one context slot, each run under its own key.

    Args:
        transfer: the decode unit's transport.
        pools: each tp rank's registered pool (local access), in tp order.
        geometry: the pools' geometry (the same on every rank of a unit).
        page_ids: the granted pages (the same ids on every rank).
        context: the registered context buffer; the slot is ``[slot_offset_bytes, + slot_bytes)``
            (None: no slot, as for a request moving between decode units: only pages move).
    Returns:
        The keys; revoke them with `GrantKeys.revoke` (also when this raises, nothing stays open).
    Raises:
        TransferError: the provider refused a registration.
    """
    keys = GrantKeys()
    try:
        runs = page_runs(geometry, page_ids)
        for pool in pools:
            rank_segments = []
            for offset, length in runs:
                # a grant key covers part of the pool's own memory: device memory stays device memory
                region = transfer.register_pointer(pool.address + offset, length, cuda_device=pool.cuda_device)
                keys.registrations.append(region)
                rank_segments.append(_segment(offset, region.descriptor))
            keys.segments.append(rank_segments)
        if context is not None:
            region = transfer.register_pointer(context.address + slot_offset_bytes, slot_bytes)
            keys.registrations.append(region)
            keys.context = _segment(slot_offset_bytes, region.descriptor)
    except BaseException:
        keys.revoke(transfer)
        raise
    return keys


def _segment(offset: int, d: RegionDescriptor) -> pr.GrantSegment:
    return pr.GrantSegment(offset, d.length_bytes, d.key, d.check)


class GrantTargets:
    """Where one decode rank's granted runs are, and how a write into its pool lands in them (prefill side).

    Args:
        pool: the decode rank's pool descriptor (from the address book: its addressing and mr_mode).
        segments: the grant's runs of that rank, from the `PrefillRequest`.
    Raises:
        ValueError: a segment lies outside the pool or overlaps another.
    """

    def __init__(self, pool: RegionDescriptor, segments: Sequence[pr.GrantSegment]):
        from disaggsdk.transfer import RegionDescriptor

        ordered = sorted(segments, key=lambda s: s.offset_bytes)
        end = 0
        for s in ordered:
            if s.offset_bytes < end or s.length_bytes <= 0 or s.offset_bytes + s.length_bytes > pool.length_bytes:
                raise ValueError(f"grant segment [{s.offset_bytes}, +{s.length_bytes}) is outside the "
                                 f"{pool.length_bytes}-byte pool or overlaps another")
            end = s.offset_bytes + s.length_bytes
        self._starts = [s.offset_bytes for s in ordered]
        self._segments = ordered
        # a segment is a registration of its own: byte 0 is the pool's byte `offset` (a virtual
        # address where the provider addresses by address, else offsets start again at 0)
        self.descriptors = [
            RegionDescriptor(pool.addr_base + s.offset_bytes if pool.addr_base else 0, s.key, s.length_bytes,
                             pool.mr_mode, s.check)
            for s in ordered
        ]

    def split(self, dst_offsets: array[int],
              *columns: array[int]) -> Iterator[tuple[RegionDescriptor, array[int], list[array[int]]]]:
        """The entries of a batch grouped by the segment they land in, offsets made relative to it.

        Args:
            dst_offsets: [n], uint64, into the pool.
            columns: other [n] arrays that travel with the entries (source offsets, lengths: the
                last one is the lengths).
        Yields:
            (segment descriptor, dst offsets in it, the columns' entries), one per segment used.
        Raises:
            ValueError: an entry is not inside one granted segment (nothing of the batch was sent).
        """
        lengths = columns[-1]
        groups: dict[int, tuple[array[int], list[array[int]]]] = {}
        for i, off in enumerate(dst_offsets):
            k = bisect.bisect_right(self._starts, off) - 1
            seg = self._segments[k] if k >= 0 else None
            if seg is None or off + lengths[i] > seg.offset_bytes + seg.length_bytes:
                raise ValueError(f"a write to pool bytes [{off}, +{lengths[i]}) is outside every granted segment")
            dst, cols = groups.setdefault(k, (array("Q"), [array(c.typecode) for c in columns]))
            dst.append(off - seg.offset_bytes)
            for out, col in zip(cols, columns):
                out.append(col[i])
        for k, (dst, cols) in groups.items():
            yield self.descriptors[k], dst, cols
