"""Transfer routes: which prefill rank writes which slice of each page to which decode rank.

A route connects one prefill instance P to one decode instance D. Ranks in a route are **tp
ranks**: a request is prefilled by one dp group of P and decoded by one dp group of D, and every
dp group of an instance shards its KV the same way, so one table serves every (dp group, dp group)
pair; `Instance.rank_of(dp_rank, tp_rank)` turns a tp rank into a device.
"""

from __future__ import annotations

import random
from typing import Literal

import attrs

from disaggsdk.plan.pages import PageRuns, PageShape, slice_runs, whole_page_runs
from disaggsdk.plan.placement import Instance
from disaggsdk.plan.sharding import REPLICATED, HeadRange, Sharding

# how a route moves a page: the same shards on both sides ("identical"; "replicate" when their
# replica sets differ), several prefill shards into one decode shard ("reconstruct"), one into
# several ("split"), or the whole MLA latent ("mla")
RouteKind = Literal["identical", "reconstruct", "split", "replicate", "mla"]

CONTEXT_SRC_TP_RANK = 0  # head rank of the prefill dp group
CONTEXT_DST_TP_RANK = 0  # head rank of the decode dp group


@attrs.frozen
class Transfer:
    """One source rank writing one head slice of every page of every layer to one dest rank."""

    src_tp_rank: int
    dst_tp_rank: int
    heads: HeadRange  # [start, stop) of global KV heads moved, or "replicated" (whole MLA page)
    hnd: PageRuns  # runs per page per layer when pages are HND
    nhd: PageRuns  # runs per page per layer when pages are NHD

    def page_runs(self, layout: str) -> PageRuns:
        """The runs of one page of one layer under ``layout`` ("HND" or "NHD").

        Raises:
            ValueError: an unknown layout.
        """
        if layout not in ("HND", "NHD"):
            raise ValueError(f"layout must be 'HND' or 'NHD', got {layout!r}")
        return self.hnd if layout == "HND" else self.nhd

    @property
    def writes_per_page_layer(self) -> dict[str, int]:
        """Writes per page per layer: ``{"HND": n, "NHD": m}``."""
        return {"HND": self.hnd.count, "NHD": self.nhd.count}


@attrs.frozen
class Route:
    """Every transfer from prefill instance ``prefill`` to decode instance ``decode``."""

    prefill: str
    decode: str
    kind: RouteKind
    src: Sharding
    dst: Sharding
    src_shape: PageShape
    dst_shape: PageShape
    num_layers: int
    transfers: tuple[Transfer, ...]  # sorted by (dst_tp_rank, src_tp_rank)
    replica_assignment: tuple[int, ...]  # D replica set q -> P replica set (before rotation)
    seed: int  # the spec's seed: per-request source choice depends on it

    @property
    def source_per_request(self) -> bool:
        """True when the P replica set that writes is rotated per request (see module doc)."""
        return self.dst.num_replica_sets < self.src.num_replica_sets

    def transfers_to(self, dst_tp_rank: int) -> tuple[Transfer, ...]:
        """Transfers into one destination tp rank."""
        return tuple(t for t in self.transfers if t.dst_tp_rank == dst_tp_rank)

    def transfers_for(self, request_id: str | int) -> tuple[Transfer, ...]:
        """The transfers of one request: `transfers` with the source set rotated when per-request.

        Args:
            request_id: the request's id; with the spec's seed it fixes the choice.

        Returns:
            Transfers whose ``src_tp_rank`` is the rank that writes for this request.
        """
        offset = request_offset(self, request_id)
        if offset == 0:
            return self.transfers
        sets = self.src.num_replica_sets
        return tuple(
            attrs.evolve(
                t,
                src_tp_rank=self.src.rank_of(
                    self.src.shard_of(t.src_tp_rank),
                    (self.src.replica_set_of(t.src_tp_rank) + offset) % sets,
                ),
            )
            for t in self.transfers
        )


def request_offset(route: Route, request_id: str | int) -> int:
    """How far a request rotates the source replica sets of ``route`` (0 unless per-request).

    Deterministic in (spec seed, request id), so the prefill and decode sides agree without
    telling each other.
    """
    if not route.source_per_request:
        return 0
    return random.Random(f"{route.seed}/{request_id}").randrange(route.src.num_replica_sets)


def mla_dp_source(route: Route, request_id: str | int) -> int:
    """The prefill tp rank that writes destination tp rank 0's pages for one request.

    Made for MLA with data-parallel decode (decode tp=1): every prefill rank holds the latent, and
    the writer is drawn per request so that all prefill devices and NICs share the load. Works on
    any route (GQA: the rank sending the first head slice).

    Args:
        route: the route the request travels.
        request_id: the request's id.

    Returns:
        A tp rank of the prefill dp group.
    """
    return route.transfers_for(request_id)[0].src_tp_rank


def make_route(prefill: Instance, decode: Instance, src_shape: PageShape, dst_shape: PageShape, num_layers: int,
               seed: int) -> Route:
    """Compute the route from ``prefill`` to ``decode``.

    Args:
        prefill: the source instance.
        decode: the destination instance.
        src_shape: page shape on a prefill rank.
        dst_shape: page shape on a decode rank.
        num_layers: layers whose KV moves (pages per request are per layer).
        seed: the spec's seed (replica assignment and per-request source choice).

    Returns:
        The route, transfers sorted by destination then source tp rank.
    """
    src, dst = prefill.sharding, decode.sharding
    assert src.attention == dst.attention and src.num_kv_heads == dst.num_kv_heads
    if src.is_replicated:
        # MLA: peer ranks pair up; keep that fixed rather than shuffled (rank i -> rank i).
        assignment = tuple(q % src.num_replica_sets for q in range(dst.num_replica_sets))
    else:
        p_sets = list(range(src.num_replica_sets))
        random.Random(f"{seed}/{prefill.name}/{decode.name}").shuffle(p_sets)
        assignment = tuple(p_sets[q % len(p_sets)] for q in range(dst.num_replica_sets))
    transfers = []
    for dst_rank in range(dst.tp):
        p_set = assignment[dst.replica_set_of(dst_rank)]
        if src.is_replicated:
            page = whole_page_runs(dst_shape)
            transfers.append(Transfer(src.rank_of(0, p_set), dst_rank, REPLICATED, page, page))
            continue
        d_start, d_stop = dst.shard_heads(dst.shard_of(dst_rank))
        for shard in range(src.num_shards):
            s_start, s_stop = src.shard_heads(shard)
            start, stop = max(s_start, d_start), min(s_stop, d_stop)
            if start >= stop:
                continue
            args = ((start, stop), (s_start, s_stop), (d_start, d_stop), dst_shape)
            transfers.append(
                Transfer(
                    src_tp_rank=src.rank_of(shard, p_set),
                    dst_tp_rank=dst_rank,
                    heads=(start, stop),
                    hnd=slice_runs("HND", *args),
                    nhd=slice_runs("NHD", *args),
                )
            )
    transfers.sort(key=lambda t: (t.dst_tp_rank, t.src_tp_rank))
    return Route(
        prefill=prefill.name,
        decode=decode.name,
        kind=_kind(src, dst),
        src=src,
        dst=dst,
        src_shape=src_shape,
        dst_shape=dst_shape,
        num_layers=num_layers,
        transfers=tuple(transfers),
        replica_assignment=assignment,
        seed=seed,
    )


def _kind(src: Sharding, dst: Sharding) -> RouteKind:
    if src.is_replicated:
        return "mla"
    if src.num_shards > dst.num_shards:
        return "reconstruct"
    if src.num_shards < dst.num_shards:
        return "split"
    return "identical" if src.num_replica_sets == dst.num_replica_sets else "replicate"
