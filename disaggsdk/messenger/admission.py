"""Whether a prefill unit may act on a `PrefillRequest`: every field checked before a byte moves.

Pure: the frame's MAC and version were checked by `protocol.decode_message`; here the request is
held against what the launcher said about the decode unit (its registered regions, pool size,
context slots) and against this unit's KV format (LESSONS.md: mismatched configs found only under
load; remote offsets must be checked against the grant). A problem is a string
``"<reason>: <what is wrong>"``; the reason is what the stats count.
"""

from __future__ import annotations

from dataclasses import dataclass

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.plan.writes import num_prefill_pages

MAX_IMM = 1 << 32


@dataclass(frozen=True)
class LocalFormat:
    """What must match between the two sides."""

    model: str
    layout: str
    page_size: int
    kv_dtype: str
    context_slot_bytes: int  # this model's context payload


def check_request(msg: pr.PrefillRequest, decode: UnitInfo | None, dst_num_pages: int, local: LocalFormat) -> str | None:
    """The first problem with ``msg``, or None when it may be served.

    Args:
        msg: the decoded request.
        decode: the decode unit it claims to come from (None: not a peer of this deployment).
        dst_num_pages: pages in that decode unit's pool (from its registered region).
        local: this unit's KV format.
    Returns:
        None, or ``"<reason>: <detail>"`` with reason one of unknown_peer, mismatch, bad_request,
        bad_region, bad_pages, bad_context.
    """
    if decode is None:
        return f"unknown_peer: {msg.decode_instance} is not a decode unit of this deployment"
    mine = (local.model, local.layout, local.page_size, local.kv_dtype)
    theirs = (msg.model, msg.layout, msg.page_size, msg.kv_dtype)
    if mine != theirs:
        return f"mismatch: (model, layout, page_size, kv_dtype) here {mine}, request says {theirs}"
    if not 0 < msg.imm < MAX_IMM or len(msg.token_ids) < 2:
        return "bad_request: imm must be 32-bit and non-zero, and the prompt at least 2 tokens"
    tp = len(decode.pool_regions)
    if msg.decode_tp != tp or sorted(d.tp_rank for d in msg.destinations) != list(range(tp)):
        return f"mismatch: decode has tp={tp}, request names ranks {[d.tp_rank for d in msg.destinations]}"
    need = num_prefill_pages(len(msg.token_ids), local.page_size)
    first = msg.destinations[0].page_ids
    for d in msg.destinations:
        if d.region != decode.pool_regions[d.tp_rank]:
            return f"bad_region: rank {d.tp_rank}'s region is not the pool that decode unit registered"
        if len(d.page_ids) != need:
            return f"bad_pages: {len(d.page_ids)} pages for {len(msg.token_ids)} tokens, need {need}"
        if any(not 0 <= p < dst_num_pages for p in d.page_ids) or len(set(d.page_ids)) != len(d.page_ids):
            return f"bad_pages: page ids outside [0, {dst_num_pages}) or repeated"
        if d.page_ids != first:
            return "bad_pages: every decode rank holds a request in the same page ids"
    c = msg.context
    if c is None or c.region != decode.context_region or c.length_bytes != local.context_slot_bytes:
        return "bad_context: the context slot is not the decode unit's buffer or has the wrong size"
    if c.offset_bytes % decode.context_slot_bytes or c.offset_bytes // decode.context_slot_bytes >= decode.num_context_slots:
        return "bad_context: the context slot offset is outside the decode unit's buffer"
    return None
