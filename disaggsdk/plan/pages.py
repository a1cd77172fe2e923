"""The byte layout of one KV page and the contiguous runs a head slice occupies in it.

This is the contract between the planner, the engine's KV pool and the transport (see
docs/plan-json.md). A rank's KV pool is one buffer ``[num_layers][num_pages][page_bytes]``; one
page of one layer is laid out as
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from disaggsdk.plan.sharding import Sharding

LAYOUTS = ("HND", "NHD")


@attrs.frozen
class PageShape:
    """Sizes of one page of one layer on one rank."""

    page_size: int  # tokens per page
    heads_local: int  # KV heads on the rank (1 "head" = the latent for MLA)
    head_bytes_per_token: int  # K and V of one head for one token (MLA: the latent)
    is_mla: bool

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of one layer on the rank."""
        return self.page_size * self.heads_local * self.head_bytes_per_token


def page_shape(sharding: Sharding, page_size: int, head_dim: int, latent_dim: int, elem_bytes: int) -> PageShape:
    """The page shape of a rank of ``sharding``.

    Args:
        sharding: the rank's tp group sharding.
        page_size: tokens per page.
        head_dim: GQA head dimension (unused for MLA).
        latent_dim: MLA ``kv_lora_rank + qk_rope_head_dim`` (unused for GQA).
        elem_bytes: bytes per cache element (the KV dtype).

    Returns:
        The page shape.
    """
    if sharding.is_replicated:
        return PageShape(page_size, 1, latent_dim * elem_bytes, True)
    return PageShape(page_size, sharding.heads_per_rank, 2 * head_dim * elem_bytes, False)


@attrs.frozen
class PageRuns:
    """The contiguous byte runs that carry one transfer's slice of one page of one layer.

    Run ``i`` (0 <= i < count) copies ``length_bytes`` from source page offset
    ``src_offset_bytes + i * src_stride_bytes`` to destination page offset
    ``dst_offset_bytes + i * dst_stride_bytes``. Each run is one RDMA write.
    """

    count: int
    length_bytes: int
    src_offset_bytes: int
    dst_offset_bytes: int
    src_stride_bytes: int = 0
    dst_stride_bytes: int = 0

    def runs(self) -> Iterator[tuple[int, int, int]]:
        """Yield ``(src_offset_bytes, dst_offset_bytes, length_bytes)`` for each write."""
        for i in range(self.count):
            yield (
                self.src_offset_bytes + i * self.src_stride_bytes,
                self.dst_offset_bytes + i * self.dst_stride_bytes,
                self.length_bytes,
            )


def slice_runs(layout: str, heads: tuple[int, int], src_heads: tuple[int, int], dst_heads: tuple[int, int],
               shape: PageShape) -> PageRuns:
    """The runs moving GQA heads ``heads`` from a source page to a destination page.

    Args:
        layout: "HND" or "NHD".
        heads: [start, stop) of the global KV heads moved; inside both ranges below.
        src_heads: [start, stop) of the heads the source rank holds.
        dst_heads: [start, stop) of the heads the destination rank holds.
        shape: the page shape, per head (identical on both sides but for ``heads_local``).

    Returns:
        The runs of one page of one layer.
    """
    start, stop = heads
    assert src_heads[0] <= start < stop <= src_heads[1]
    assert dst_heads[0] <= start < stop <= dst_heads[1]
    token_bytes = shape.head_bytes_per_token  # one head, one token, K and V
    if layout == "HND":
        head_bytes = shape.page_size * token_bytes  # one head's K and V rows of the page
        return PageRuns(
            count=1,
            length_bytes=(stop - start) * head_bytes,
            src_offset_bytes=(start - src_heads[0]) * head_bytes,
            dst_offset_bytes=(start - dst_heads[0]) * head_bytes,
        )
    assert layout == "NHD", layout
    if heads == src_heads == dst_heads:  # both pages whole: one run
        return PageRuns(1, shape.page_size * (stop - start) * token_bytes, 0, 0)
    return PageRuns(
        count=shape.page_size,
        length_bytes=(stop - start) * token_bytes,
        src_offset_bytes=(start - src_heads[0]) * token_bytes,
        dst_offset_bytes=(start - dst_heads[0]) * token_bytes,
        src_stride_bytes=(src_heads[1] - src_heads[0]) * token_bytes,
        dst_stride_bytes=(dst_heads[1] - dst_heads[0]) * token_bytes,
    )


def whole_page_runs(shape: PageShape) -> PageRuns:
    """One run moving a whole page (MLA, or a GQA page whose heads match on both sides)."""
    return PageRuns(1, shape.page_bytes, 0, 0)
