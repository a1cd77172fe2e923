"""Whether a prefill unit may act on a `PrefillRequest`: every field checked before a byte moves.

Pure: the frame's MAC and version were checked by `protocol.decode_message`; here the request is
held against what the launcher said about the decode unit (its registered regions, pool size,
context slots) and against this unit's KV format (a mismatched config must fail here, not under
load; remote offsets are checked against the grant). A problem is a `Rejection`: a
`RejectReason` the stats count and a detail for the decode side's log; on the wire
(`PrefillRejected.reason`) it is ``"<reason>: <detail>"``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.plan.writes import num_prefill_pages

MAX_IMM = 1 << 32


class RejectReason(enum.Enum):
    """Why a prefill unit refuses a `PrefillRequest` (the key of its ``rejected`` counters)."""

    UNKNOWN_PEER = "unknown_peer"  # not a decode unit of this deployment (incarnation included)
    MISMATCH = "mismatch"  # model, layout, page size, dtype or tp differ between the sides
    BAD_REQUEST = "bad_request"  # an immediate or prompt no request can have
    BAD_REGION = "bad_region"  # a destination that is not the pool the decode unit registered
    BAD_PAGES = "bad_pages"  # page ids outside the pool, repeated, too few for the prompt, or a bad cached count
    BAD_CONTEXT = "bad_context"  # a context slot outside the decode unit's buffer
    DUPLICATE = "duplicate"  # the request is already being prefilled here
    OVERLOADED = "overloaded"  # no context staging slot free: retry elsewhere
    ENGINE = "engine"  # the engine refused the prompt
    LEAVING = "leaving"  # the unit is changing role: retry elsewhere


@dataclass(frozen=True)
class Rejection:
    """A refused request: the reason counted and a detail that says what is wrong."""

    reason: RejectReason
    detail: str

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}"


@dataclass(frozen=True)
class LocalFormat:
    """What must match between the two sides."""

    model: str
    layout: str
    page_size: int
    kv_dtype: str
    context_slot_bytes: int  # this model's context payload


def check_request(msg: pr.PrefillRequest, decode: UnitInfo | None, dst_num_pages: int,
                  local: LocalFormat) -> Rejection | None:
    """The first problem with ``msg``, or None when it may be served.

    Args:
        msg: the decoded request.
        decode: the decode unit it claims to come from (None: not a peer of this deployment).
        dst_num_pages: pages in that decode unit's pool (from its registered region).
        local: this unit's KV format.
    Returns:
        None, or the first `Rejection` (unknown_peer, mismatch, bad_request, bad_region,
        bad_pages or bad_context).
    """
    R = RejectReason
    if decode is None:
        return Rejection(R.UNKNOWN_PEER, f"{msg.decode_instance} is not a decode unit of this deployment")
    mine = (local.model, local.layout, local.page_size, local.kv_dtype)
    theirs = (msg.model, msg.layout, msg.page_size, msg.kv_dtype)
    if mine != theirs:
        return Rejection(R.MISMATCH, f"(model, layout, page_size, kv_dtype) here {mine}, request says {theirs}")
    if not 0 < msg.imm < MAX_IMM or len(msg.token_ids) < 2:
        return Rejection(R.BAD_REQUEST, "imm must be 32-bit and non-zero, and the prompt at least 2 tokens")
    tp = len(decode.pool_regions)
    if msg.decode_tp != tp or sorted(d.tp_rank for d in msg.destinations) != list(range(tp)):
        return Rejection(R.MISMATCH, f"decode has tp={tp}, request names ranks {[d.tp_rank for d in msg.destinations]}")
    need = num_prefill_pages(len(msg.token_ids), local.page_size)
    if not 0 <= msg.num_cached_pages < need:
        return Rejection(R.BAD_PAGES, f"num_cached_pages {msg.num_cached_pages} outside [0, {need}): "
                                      f"a prompt of {len(msg.token_ids)} tokens moves {need} pages")
    need -= msg.num_cached_pages
    first = msg.destinations[0].page_ids
    for d in msg.destinations:
        if d.region != decode.pool_regions[d.tp_rank]:
            return Rejection(R.BAD_REGION, f"rank {d.tp_rank}'s region is not the pool that decode unit registered")
        if len(d.page_ids) != need:
            return Rejection(R.BAD_PAGES, f"{len(d.page_ids)} pages for {len(msg.token_ids)} tokens, need {need}")
        if any(not 0 <= p < dst_num_pages for p in d.page_ids) or len(set(d.page_ids)) != len(d.page_ids):
            return Rejection(R.BAD_PAGES, f"page ids outside [0, {dst_num_pages}) or repeated")
        if d.page_ids != first:
            return Rejection(R.BAD_PAGES, "every decode rank holds a request in the same page ids")
    c = msg.context
    if c is None or c.region != decode.context_region or c.length_bytes != local.context_slot_bytes:
        return Rejection(R.BAD_CONTEXT, "the context slot is not the decode unit's buffer or has the wrong size")
    if c.offset_bytes % decode.context_slot_bytes or c.offset_bytes // decode.context_slot_bytes >= decode.num_context_slots:
        return Rejection(R.BAD_CONTEXT, "the context slot offset is outside the decode unit's buffer")
    return None
