"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, seeds, logprobs.

The sampler never raises on the numbers it is given: logits may hold NaN or +-inf (a broken
kernel, a fp16 overflow), and whatever `SamplingParams` lets through it works in float32 on
``(logits - row max) / temperature``, whose largest entry is exactly 0, so softmax always has a
finite sum >= 1. A row with no usable logit at all falls back to argmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from disaggsdk.engine.sampling_params import MIN_TEMPERATURE, SamplingError, SamplingParams, TokenLogprobs

__all__ = ["MIN_TEMPERATURE", "SamplingError", "SamplingParams", "TokenLogprobs", "new_generator", "sample"]

_NEG_INF = float("-inf")
_MAX_TEMPERATURE = 1e30  # (x - max) / t for finite x stays a number (inf / inf would be NaN)
_LOGPROB_FLOOR = torch.finfo(torch.float32).min  # reported instead of -inf, so logprobs stay finite


def new_generator(seed: int | None, fallback_seed: int) -> torch.Generator:
    """A CPU generator for one request: its own seed when given, else one drawn from the engine's."""
    return torch.Generator().manual_seed(seed if seed is not None else fallback_seed)


def clean_logits(logits: torch.Tensor) -> torch.Tensor:
    """Logits the softmax can take: NaN is -inf (never chosen); a row with +inf keeps only those.

    Args:
        logits: [batch, vocab], any float dtype and device.
    Returns:
        [batch, vocab], float32, CPU: every entry finite or -inf; each row's max is finite unless
        the whole row is -inf.
    """
    logits = logits.detach().float().cpu().nan_to_num(nan=_NEG_INF, posinf=float("inf"), neginf=_NEG_INF)
    pos_inf = logits == float("inf")
    rows = pos_inf.any(dim=-1)
    if rows.any():  # +inf beats every finite logit: those tokens share the whole mass
        logits[rows] = torch.zeros_like(logits[rows]).masked_fill(~pos_inf[rows], _NEG_INF)
    return logits


def _safe_temperature(temperature: float) -> float:
    """The temperature to divide by: `SamplingParams` checks it, this holds even if it was bypassed."""
    t = float(temperature)
    if t != t or t < MIN_TEMPERATURE:  # NaN, or below the floor
        return MIN_TEMPERATURE
    return min(t, _MAX_TEMPERATURE)


def target_probs(row: torch.Tensor, p: SamplingParams) -> torch.Tensor | None:
    """The distribution ``p`` samples from for a cleaned row ([vocab], float32): temperature, then
    min-p, top-k, top-p (vLLM's order); None when nothing is left to draw (the caller takes the argmax)."""
    top = row.max()
    if not torch.isfinite(top):
        return None
    # subtract first: (x - max) <= 0 so dividing by a small temperature cannot overflow to +inf
    row = (row - top) / _safe_temperature(p.temperature)
    if p.min_p:  # tokens less likely than min_p times the most likely one (whose logit is now 0)
        row = row.masked_fill(row.exp() < p.min_p, _NEG_INF)
    if p.top_k and p.top_k < row.numel():
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, _NEG_INF)
    probs = row.softmax(-1)
    if p.top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= p.top_p
        drop[0] = False
        sorted_probs[drop] = 0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    total = probs.sum()
    if not (torch.isfinite(probs).all() and torch.isfinite(total) and total > 0):
        return None
    return probs


def _sample_row(row: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> int:
    """One sampled token from a cleaned row ([vocab], float32); argmax when nothing is left to draw."""
    probs = target_probs(row, p)
    if probs is None:
        return int(row.argmax())
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprobs(all_lp: torch.Tensor, token_id: int, num_top: int) -> TokenLogprobs:
    """The logprob of ``token_id`` and the ``num_top`` best of one row of log-softmaxed logits."""
    top: tuple[tuple[int, float], ...] = ()
    if num_top:
        vals, ids = all_lp.topk(min(num_top, all_lp.shape[-1]))
        top = tuple(zip(ids.tolist(), vals.tolist()))
    return TokenLogprobs(token_id, float(all_lp[token_id]), top)


def log_softmax_finite(logits: torch.Tensor) -> torch.Tensor:
    """log_softmax of cleaned logits with -inf reported as float32's lowest value."""
    return logits.log_softmax(-1).nan_to_num(nan=_LOGPROB_FLOOR).clamp(min=_LOGPROB_FLOOR)


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None]) -> tuple[list[int], list[TokenLogprobs | None]]:
    """Pick one token per row; never raises on NaN or +-inf logits, always returns ids in range.

    Args:
        logits: [batch, vocab], any float dtype and device.
        params: one per row.
        generators: one per row (used only by sampled rows, so greedy rows never move them).
    Returns:
        (token_ids, logprobs): one token id per row, in ``[0, vocab)``, and per row a
        `TokenLogprobs` when that row's params ask for logprobs, else None. Logprobs are finite
        (-inf is reported as float32's lowest value).
    """
    logits = clean_logits(logits)
    greedy_ids = logits.argmax(dim=-1)
    token_ids = [
        int(greedy_ids[i]) if p.greedy else _sample_row(logits[i], p, generators[i]) for i, p in enumerate(params)
    ]
    logprobs: list[TokenLogprobs | None] = [None] * len(params)
    if any(p.logprobs is not None for p in params):
        all_lp = log_softmax_finite(logits)
        for i, p in enumerate(params):
            if p.logprobs is not None:
                logprobs[i] = token_logprobs(all_lp[i], token_ids[i], p.logprobs)
    return token_ids, logprobs
