"""What changes a request's logits before a token is chosen, with vLLM's formulas and order."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from disaggsdk.engine.sampling_params import SamplingParams


def process_rows(rows: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                 outputs: Sequence[Sequence[int]], eos_ids: frozenset[int]) -> None:
    """Apply ``params``' processors to ``rows`` ([n, vocab] float), row i having produced ``outputs[i]``."""
    vocab = rows.shape[1]
    device = rows.device
    with torch.inference_mode():
        for bias_token, bias in params.logit_bias:
            if bias_token < vocab:
                rows[:, bias_token] += bias
        ends = [t for t in (*eos_ids, *params.stop_token_ids) if t < vocab] if not params.ignore_eos else \
            [t for t in params.stop_token_ids if t < vocab]
        prompt = torch.tensor(list(prompt_ids), dtype=torch.int64, device=device)
        for i, out in enumerate(outputs):
            row = rows[i]
            if len(out) < params.min_tokens and ends:
                row[torch.tensor(ends, device=device)] = float("-inf")
            counts = torch.bincount(torch.tensor(list(out), dtype=torch.int64, device=device),
                                    minlength=vocab)[:vocab].to(row.dtype)
            if params.repetition_penalty != 1.0:
                seen = counts > 0
                seen[prompt[prompt < vocab]] = True
                penalised = torch.where(row > 0, row / params.repetition_penalty, row * params.repetition_penalty)
                row.copy_(torch.where(seen, penalised, row))
            if params.frequency_penalty:
                row -= params.frequency_penalty * counts
            if params.presence_penalty:
                row -= params.presence_penalty * (counts > 0).to(row.dtype)
