"""A multi-turn run by turn index: TTFT per turn, prefix-cache hits against the reusable tokens,
and a digest of every output token, so that two runs can be compared token for token (pure)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import TypedDict

from disaggsdk.bench.dataset import BenchRequest
from disaggsdk.bench.multi_turn import prefix_reuse
from disaggsdk.bench.stream_timeline import StreamTimeline


class TurnRow(TypedDict):
    """One turn index of a multi-turn run (see `turn_summary`)."""

    turn: int
    count: int
    failed: int
    mean_ttft_ms: float | None
    prompt_tokens: int
    reusable_tokens: int
    cached_tokens: int | None


class TurnSummary(TypedDict):
    """A multi-turn run by turn index, as `turn_summary` returns it (the result JSON's ``multi_turn`` keys)."""

    per_turn: list[TurnRow]
    mean_ttft_turn1_ms: float | None
    mean_ttft_turns2plus_ms: float | None
    prompt_tokens: int
    reusable_tokens: int
    cached_tokens: int | None
    hit_rate: float | None
    output_digest: str | None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def send_order_reuse(prompts: Sequence[str | list[int]], sent_s: Sequence[float]) -> list[int]:
    """For each prompt, the longest prefix it shares with a prompt sent before it (`prefix_reuse`
    in the order the run sent them, ties in list order), in the order given."""
    order = sorted(range(len(prompts)), key=lambda i: (sent_s[i], i))
    shared = prefix_reuse([prompts[i] for i in order]).shared
    out = [0] * len(prompts)
    for i, n in zip(order, shared):
        out[i] = n
    return out


def output_digest(timelines: Sequence[StreamTimeline]) -> str | None:
    """SHA-256 of every request's output token ids, in the order given (a failed request counts as
    null); None when no completed request carried its token ids (the server was not asked, or
    ignores ``return_token_ids``)."""
    if not any(t.ok and t.output_token_ids for t in timelines):
        return None
    outputs = [t.output_token_ids if t.ok else None for t in timelines]
    return hashlib.sha256(json.dumps(outputs, separators=(",", ":")).encode()).hexdigest()


def turn_summary(conversations: Sequence[Sequence[BenchRequest]], timelines: Sequence[StreamTimeline]
                 ) -> TurnSummary:
    """The run by turn index, from its conversations and their timelines (conversation by
    conversation, turns in order, as `serve_bench.run_conversations` returns them).

    Reusable tokens are each prompt's longest prefix shared with a prompt sent before it; cached
    tokens are what the server said its prefix cache served (``usage.prompt_tokens_details``). Both
    count completed requests only.

    Returns:
        ``per_turn`` (per turn index from 1: ``count`` completed, ``failed``, ``mean_ttft_ms``,
        ``prompt_tokens``, ``reusable_tokens``, ``cached_tokens``); ``mean_ttft_turn1_ms`` and
        ``mean_ttft_turns2plus_ms``; the totals ``prompt_tokens``, ``reusable_tokens``,
        ``cached_tokens`` and ``hit_rate`` (cached / reusable); ``output_digest``. Cached tokens
        and the hit rate are None where the server reported none (or nothing was reusable), a mean
        None where no request of it completed.
    Raises:
        ValueError: a timeline count that is not the conversations' request count.
    """
    requests = [(k, req) for turns in conversations for k, req in enumerate(turns, start=1)]
    if len(requests) != len(timelines):
        raise ValueError(f"{len(timelines)} timelines for {len(requests)} requests")
    reusable = send_order_reuse([req.prompt for _, req in requests], [t.sent_s for t in timelines])
    reported = any(t.ok and t.cached_tokens is not None for t in timelines)
    per_turn: list[TurnRow] = []
    for turn in range(1, max((k for k, _ in requests), default=0) + 1):
        mine = [(t, n) for (k, _), t, n in zip(requests, timelines, reusable) if k == turn]
        done = [(t, n) for t, n in mine if t.ok]
        per_turn.append({
            "turn": turn, "count": len(done), "failed": len(mine) - len(done),
            "mean_ttft_ms": _mean([t.ttft_ms for t, _ in done]),
            "prompt_tokens": sum(t.prompt_tokens for t, _ in done),
            "reusable_tokens": sum(n for _, n in done),
            "cached_tokens": sum(t.cached_tokens or 0 for t, _ in done) if reported else None,
        })
    done_all = [(k, t, n) for (k, _), t, n in zip(requests, timelines, reusable) if t.ok]
    reusable_tokens = sum(n for _, _, n in done_all)
    cached_tokens = sum(t.cached_tokens or 0 for _, t, _ in done_all) if reported else None
    return {
        "per_turn": per_turn,
        "mean_ttft_turn1_ms": _mean([t.ttft_ms for k, t, _ in done_all if k == 1]),
        "mean_ttft_turns2plus_ms": _mean([t.ttft_ms for k, t, _ in done_all if k > 1]),
        "prompt_tokens": sum(t.prompt_tokens for _, t, _ in done_all),
        "reusable_tokens": reusable_tokens,
        "cached_tokens": cached_tokens,
        "hit_rate": cached_tokens / reusable_tokens if cached_tokens is not None and reusable_tokens else None,
        "output_digest": output_digest(timelines),
    }
