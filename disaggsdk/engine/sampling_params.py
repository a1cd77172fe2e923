"""What a request asks of the sampler: plain values, no torch, so they can cross process boundaries.

The launcher sends `SamplingParams` to its units as they are (msgspec encodes the dataclass and
runs its checks again on decode); the sampler itself lives in `disaggsdk.engine.sampling`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
