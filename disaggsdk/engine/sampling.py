"""Sampling parameters and the sampler: greedy, temperature, top-k, top-p, seeds, logprobs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from disaggsdk.errors import DisaggError


class SamplingError(DisaggError):
    """Sampling parameters that cannot be used."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token of one request.

    ``temperature == 0`` is greedy. ``top_k == 0`` and ``top_p == 1`` switch those filters off.
    ``seed`` makes a sampled request reproducible on its own, whatever else is in the batch.
    ``logprobs = N`` returns the chosen token's logprob and the N most likely tokens' (from the
    unfiltered distribution, as vLLM does).
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.max_tokens < 1:
            problems.append(f"max_tokens={self.max_tokens} must be >= 1")
        if self.temperature < 0:
            problems.append(f"temperature={self.temperature} must be >= 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            problems.append(f"top_k={self.top_k} must be >= 0 (0 switches it off)")
        if self.logprobs is not None and self.logprobs < 0:
            problems.append(f"logprobs={self.logprobs} must be >= 0")
        if problems:
            raise SamplingError("bad sampling parameters: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's logprob and, when asked, the top-N alternatives ``(token_id, logprob)``."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = field(default=())


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
