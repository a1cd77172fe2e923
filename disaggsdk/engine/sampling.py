"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, seeds, logprobs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from disaggsdk.engine.sampling_params import SamplingError, SamplingParams, TokenLogprobs

__all__ = ["SamplingError", "SamplingParams", "TokenLogprobs", "new_generator", "sample"]


def new_generator(seed: int | None, fallback_seed: int) -> torch.Generator:
    """A CPU generator for one request: its own seed when given, else one drawn from the engine's."""
    return torch.Generator().manual_seed(seed if seed is not None else fallback_seed)


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
) -> tuple[list[int], list[TokenLogprobs | None]]:
    """Pick one token per row.

    Args:
        logits: [batch, vocab], any float dtype and device.
        params: one per row.
        generators: one per row (used only by sampled rows, so greedy rows never move them).
    Returns:
        (token_ids, logprobs): one token id per row, and per row a `TokenLogprobs` when that
        row's params ask for logprobs, else None.
    """
    logits = logits.float().cpu()
    greedy_ids = logits.argmax(dim=-1)
    token_ids: list[int] = []
    for i, p in enumerate(params):
        if p.greedy:
            token_ids.append(int(greedy_ids[i]))
            continue
        row = logits[i] / p.temperature
        if p.top_k and p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        probs = row.softmax(-1)
        if p.top_p < 1:
            sorted_probs, order = probs.sort(descending=True)
            # keep the smallest prefix whose mass reaches top_p (the first token always stays)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
            sorted_probs[drop] = 0
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        token_ids.append(int(torch.multinomial(probs, 1, generator=generators[i])))
    logprobs: list[TokenLogprobs | None] = [None] * len(params)
    if any(p.logprobs is not None for p in params):
        all_lp = logits.log_softmax(-1)
        for i, p in enumerate(params):
            if p.logprobs is None:
                continue
            top: tuple[tuple[int, float], ...] = ()
            if p.logprobs:
                vals, ids = all_lp[i].topk(p.logprobs)
                top = tuple(zip(ids.tolist(), vals.tolist()))
            logprobs[i] = TokenLogprobs(token_ids[i], float(all_lp[i, token_ids[i]]), top)
    return token_ids, logprobs
