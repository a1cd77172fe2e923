"""How many writes a decode rank must expect for one request: the number its counter waits for.

A request with a prompt of N tokens moves the KV of N - 1 tokens: the last prompt token is the
first token decode runs (docs/architecture.md, step 6). Pages always move whole, the unused tail of
the last page included, so a request needs ``ceil((N - 1) / page_size)`` pages per layer. On top,
one context write (hidden state and logits of the last prefilled position) lands on the decode
head rank (tp rank 0 of the dp group). A one-token prompt needs no prefill at all: 0 writes.
"""

from __future__ import annotations

import attrs

from disaggsdk.plan.routes import CONTEXT_DST_TP_RANK, Route


@attrs.frozen
class RankWrites:
    """Writes one destination tp rank receives for one request."""

    dst_tp_rank: int
    kv_writes: int  # page writes, all layers
    context_writes: int  # 1 on the head rank when anything is prefilled, else 0

    @property
    def total(self) -> int:
        return self.kv_writes + self.context_writes


@attrs.frozen
class ExpectedWrites:
    """Writes a decode dp group receives for one request, per rank and in total."""

    num_tokens: int
    num_pages: int  # pages per layer that move (the decode side's cached ones excluded)
    layout: str
    ranks: tuple[RankWrites, ...]  # indexed by destination tp rank

    @property
    def kv_writes(self) -> int:
        return sum(r.kv_writes for r in self.ranks)

    @property
    def context_writes(self) -> int:
        return sum(r.context_writes for r in self.ranks)

    @property
    def total(self) -> int:
        """What one counter for the whole dp group waits for (one messenger per instance)."""
        return sum(r.total for r in self.ranks)


def num_prefill_pages(num_tokens: int, page_size: int) -> int:
    """Pages per layer that move for a prompt of ``num_tokens`` (its last token stays behind).

    Raises:
        ValueError: a negative token count or a page size below 1.
    """
    if num_tokens < 0 or page_size < 1:
        raise ValueError(f"need num_tokens >= 0 and page_size >= 1, got {num_tokens}, {page_size}")
    return -(-max(num_tokens - 1, 0) // page_size)


def expected_writes(route: Route, num_tokens: int, layout: str, num_cached_pages: int = 0) -> ExpectedWrites:
    """Writes each destination rank of ``route`` receives for a prompt of ``num_tokens`` tokens.

    Args:
        route: the (prefill, decode) route the request travels.
        num_tokens: prompt length N, the token decode starts from included.
        layout: "HND" or "NHD" (the spec's ``kv.layout``).
        num_cached_pages: the prompt's first pages the decode side holds already (its prefix
            cache): they do not move, so only the pages after them are counted.

    Returns:
        Per destination tp rank: page writes (``pages * layers * sum of writes per page-layer``
        over its incoming transfers) and context writes, and their total.

    Raises:
        ValueError: an unknown layout, a negative token count, or more cached pages than the
            prompt moves.
    """
    if layout not in ("HND", "NHD"):
        raise ValueError(f"layout must be 'HND' or 'NHD', got {layout!r}")
    pages = num_prefill_pages(num_tokens, route.dst_shape.page_size)
    if not 0 <= num_cached_pages <= pages:
        raise ValueError(f"num_cached_pages must be in [0, {pages}] for {num_tokens} tokens, got {num_cached_pages}")
    pages -= num_cached_pages
    ranks = []
    for dst_rank in range(route.dst.tp):
        per_page_layer = sum(t.page_runs(layout).count for t in route.transfers_to(dst_rank))
        context = 1 if pages and dst_rank == CONTEXT_DST_TP_RANK else 0
        ranks.append(RankWrites(dst_rank, pages * route.num_layers * per_page_layer, context))
    return ExpectedWrites(num_tokens, pages, layout, tuple(ranks))
