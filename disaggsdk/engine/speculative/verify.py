"""Verify draft tokens against the target model's logits, keeping the target's distribution exactly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from disaggsdk.engine.sampling import clean_logits, log_softmax_finite, target_probs, token_logprobs
from disaggsdk.engine.sampling_params import SamplingParams, TokenLogprobs


@dataclass(frozen=True)
class Verified:
    """What one request keeps from a speculative step."""

    token_ids: list[int]  # the accepted drafts, then one token of the target's own (1 .. k + 1 tokens)
    num_accepted: int  # drafts accepted (len(token_ids) - 1)
    logprobs: list[TokenLogprobs] | None  # per emitted token, when the request asks for logprobs


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_drafts(logits: torch.Tensor, drafts: Sequence[int], params: SamplingParams,
                  generator: torch.Generator | None) -> Verified:
    """Accept a prefix of ``drafts`` and choose the token after it.

    Args:
        logits: [len(drafts) + 1, vocab] target logits, row j for the token after draft j.
        drafts: the k draft tokens (k >= 0; with none this is plain sampling of row 0).
        params: the request's sampling parameters.
        generator: its generator (sampled requests only; greedy ones never move it).
    """
    rows = clean_logits(logits)
    k = len(drafts)
    tokens: list[int] = []
    if params.greedy:
        best = rows.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < k and drafts[accepted] == best[accepted]:
            accepted += 1
        tokens = [*drafts[:accepted], best[accepted]]
    else:
        accepted = k
        for j in range(k + 1):
            probs = target_probs(rows[j], params)
            if probs is None:  # nothing left to draw: the argmax, as plain sampling does
                choice = int(rows[j].argmax())
                if j < k and choice == drafts[j]:
                    tokens.append(choice)
                    continue
                accepted = j
                tokens.append(choice)
                break
            if j == k:
                tokens.append(_draw(probs, generator))
                break
            draft = drafts[j]
            if float(torch.rand((), generator=generator)) < float(probs[draft]):
                tokens.append(draft)
                continue
            residual = probs.clone()
            residual[draft] = 0
            accepted = j
            tokens.append(_draw(residual, generator) if residual.sum() > 0 else int(probs.argmax()))
            break
    logprobs = None
    if params.logprobs is not None:
        all_lp = log_softmax_finite(rows[: len(tokens)])
        logprobs = [token_logprobs(all_lp[j], t, params.logprobs) for j, t in enumerate(tokens)]
    return Verified(tokens, accepted, logprobs)
