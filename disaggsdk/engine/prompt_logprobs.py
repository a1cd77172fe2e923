"""Prompt logprobs: each prompt token's logprob given the tokens before it, scored where the prompt
is computed (a colocated engine, a prefill unit, a decode unit that prefills locally).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disaggsdk.engine.sampling import clean_logits, log_softmax_finite, token_logprobs

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.scheduler import ScheduledChunk


def _unscored_span(chunk: ScheduledChunk) -> tuple[int, int]:
    """(first, stop): the chunk rows that score prompt tokens not scored yet (empty: first >= stop)."""
    req = chunk.request
    if req.params.prompt_logprobs is None or not chunk.is_prefill:
        return 0, 0
    first = len(req.prompt_logprobs) - 1 - chunk.start_pos  # the row scoring the next unscored token
    stop = min(chunk.num_tokens, len(req.prompt_ids) - 1 - chunk.start_pos)
    return first, stop


def prompt_rows(chunk: ScheduledChunk) -> int:
    """Logits rows (the chunk's last ones) the chunk needs to score its part of the prompt; 0: none.

    A chunk that starts past the first unscored token cannot score it (its KV came from elsewhere):
    it scores nothing, and the request reports no prompt logprobs.
    """
    first, stop = _unscored_span(chunk)
    if first < 0 or first >= stop:
        return 0
    return chunk.num_tokens - first


def record_prompt_logprobs(chunk: ScheduledChunk, rows: torch.Tensor) -> bool:
    """Score the chunk's unscored prompt tokens from its logits ``rows`` (its last ``rows.shape[0]``
    positions, raw: before any processing). Returns True when this completed the prompt's logprobs."""
    first, stop = _unscored_span(chunk)
    skipped = chunk.num_tokens - rows.shape[0]  # positions before the rows the chunk asked for
    if first < skipped or first >= stop:
        return False
    req = chunk.request
    num_top = req.params.prompt_logprobs
    assert num_top is not None, "an empty span unless the request asked for prompt logprobs"
    all_lp = log_softmax_finite(clean_logits(rows[first - skipped : stop - skipped]))
    for j in range(first, stop):
        token = req.prompt_ids[chunk.start_pos + j + 1]
        req.prompt_logprobs.append(token_logprobs(all_lp[j - first], token, num_top))
    return len(req.prompt_logprobs) == len(req.prompt_ids)
