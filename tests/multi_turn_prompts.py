"""Multi-turn prompts for the prefix-cache tests: the bench's own synthetic conversations, as token lists."""

from __future__ import annotations

from disaggsdk.bench.multi_turn import MultiTurnShape, synthetic_conversations


def conversations(n: int, turns: int, seed: int = 0, system_len: int = 21, user_len: int = 6,
                  reply_len: int = 5) -> list[list[list[int]]]:
    """``n`` conversations of ``turns`` prompts sharing a system prompt; turn k + 1's prompt is turn
    k's plus a synthetic reply and a new user message (`bench.multi_turn`)."""
    shape = MultiTurnShape(turns=turns, system_len=system_len, user_len=user_len, output_len=reply_len)
    return [[list(r.prompt) for r in conv] for conv in synthetic_conversations(n, shape, seed).conversations]
