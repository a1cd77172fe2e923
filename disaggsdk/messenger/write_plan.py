"""From a route and a request's pages to the byte runs that move them, one layer at a time.

A rank's pool is ``[num_layers][num_pages][page_bytes]`` (docs/plan-json.md), so the byte offset
of page ``p`` of layer ``l`` is ``(l * num_pages + p) * page_bytes`` on either side. Each run of
a transfer's `PageRuns` becomes one write entry; the native library coalesces entries that are
contiguous on both sides, while immediate counts stay per entry, which is what the decode side's
counter expects (`disaggsdk.plan.expected_writes`).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from disaggsdk.plan.routes import Transfer


@dataclass(frozen=True)
class PoolGeometry:
    """Where pages sit in one rank's pool buffer."""

    num_layers: int
    num_pages: int
    page_bytes: int  # one page of one layer

    @property
    def pool_bytes(self) -> int:
        return self.num_layers * self.num_pages * self.page_bytes

    def page_offset(self, layer_id: int, page_id: int) -> int:
        """Byte offset of page ``page_id`` of layer ``layer_id`` in the pool."""
        return (layer_id * self.num_pages + page_id) * self.page_bytes

    @classmethod
    def of_region(cls, num_layers: int, page_bytes: int, length_bytes: int) -> PoolGeometry:
        """The geometry of a peer pool known only by its region length.

        Raises:
            ValueError: the length is not a whole number of pages of every layer.
        """
        per_page = num_layers * page_bytes
        if length_bytes <= 0 or length_bytes % per_page:
            raise ValueError(f"a pool of {length_bytes} bytes is not [layers={num_layers}][pages][{page_bytes}]")
        return cls(num_layers, length_bytes // per_page, page_bytes)


@dataclass(frozen=True)
class PairWrites:
    """The write entries from one source tp rank to one destination tp rank (one layer)."""

    src_tp_rank: int
    dst_tp_rank: int
    src_offsets: array[int]  # [n], uint64, into the source rank's pool
    dst_offsets: array[int]  # [n], uint64, into the destination rank's pool
    lengths: array[int]  # [n], uint64

    @property
    def num_bytes(self) -> int:
        return sum(self.lengths)

    def __len__(self) -> int:
        return len(self.lengths)


def layer_writes(transfers: Sequence[Transfer], layout: str, layer_id: int, src_geometry: PoolGeometry,
                 dst_geometry: PoolGeometry, src_page_ids: Sequence[int],
                 dst_page_ids: Sequence[int]) -> list[PairWrites]:
    """The entries moving pages ``src_page_ids[i] -> dst_page_ids[i]`` of one layer.

    Args:
        transfers: the request's transfers (``Route.transfers_for(request_id)``).
        layout: "HND" or "NHD".
        layer_id: the layer.
        src_geometry: a prefill rank's pool (same on every rank of the instance).
        dst_geometry: a decode rank's pool.
        src_page_ids: source pages, in the request's page order.
        dst_page_ids: destination pages, same length.
    Returns:
        One `PairWrites` per transfer, entries ordered page by page.
    Raises:
        ValueError: the page lists differ in length or a page id is out of its pool.
    """
    if len(src_page_ids) != len(dst_page_ids):
        raise ValueError(f"{len(src_page_ids)} source pages but {len(dst_page_ids)} destination pages")
    for pages, geometry, side in ((src_page_ids, src_geometry, "source"), (dst_page_ids, dst_geometry, "destination")):
        bad = [p for p in pages if not 0 <= p < geometry.num_pages]
        if bad:
            raise ValueError(f"{side} page ids {bad[:5]} outside [0, {geometry.num_pages})")
    out = []
    for t in transfers:
        runs = list(t.page_runs(layout).runs())
        src_offs, dst_offs, lengths = array("Q"), array("Q"), array("Q")
        for sp, dp in zip(src_page_ids, dst_page_ids):
            s_base = src_geometry.page_offset(layer_id, sp)
            d_base = dst_geometry.page_offset(layer_id, dp)
            for s_off, d_off, length in runs:
                src_offs.append(s_base + s_off)
                dst_offs.append(d_base + d_off)
                lengths.append(length)
        out.append(PairWrites(t.src_tp_rank, t.dst_tp_rank, src_offs, dst_offs, lengths))
    return out


def pages_ready(start_pos: int, num_tokens: int, page_size: int, ends_prompt: bool) -> int:
    """How many of a request's pages are complete after a chunk ``[start_pos, start_pos + n)``.

    A page partly filled by the chunk counts only when the prompt ends with it: it moves then,
    never twice.
    """
    end = start_pos + num_tokens
    return -(-end // page_size) if ends_prompt else end // page_size
