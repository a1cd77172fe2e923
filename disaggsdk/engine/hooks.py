"""Hooks the messenger uses to follow a step: the per-step chunk plan (the layer counter, the other
hook, is `engine.layer_counter`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepChunkInfo:
    """Which tokens of which request a step computes, and the pages they fill.

    Tokens ``[start_pos, start_pos + num_tokens)`` land in ``page_ids`` (the request's pages in
    order; token t sits in ``page_ids[t // page_size]`` at offset ``t % page_size``).
    """

    request_id: str
    start_pos: int
    num_tokens: int
    page_ids: tuple[int, ...]
    is_last_prefill_chunk: bool  # after this step the request's prefill is complete
