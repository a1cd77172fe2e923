"""What a request asks of the sampler: plain values, no torch, so they can cross process boundaries.

The launcher sends `SamplingParams` to its units as they are (msgspec encodes the dataclass and
runs its checks again on decode); the sampler itself lives in `disaggsdk.engine.sampling`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real

from disaggsdk.engine.structured.output import StructuredOutput
from disaggsdk.errors import DisaggError

# The smallest temperature the sampler accepts, other than 0 (greedy). Dividing logits by less
# lets a logit gap of a few units reach float32's overflow (3.4e38) and turns a row into
# inf/nan; at 1e-2 a float32 logit (|x| < 3.4e38) minus its row max, divided by it, stays finite
# in almost every row, and the sampler handles the rest. vLLM clamps small temperatures the same
# way (to 0.01 internally); we refuse them instead, so a client never gets silent greedy.
MIN_TEMPERATURE = 1e-2
# int32 for counts and token ids, int64 for seeds: what every channel (msgspec, torch) can carry.
MAX_INT32 = 2**31 - 1
MAX_SEED = 2**63 - 1


class SamplingError(DisaggError):
    """Sampling parameters that cannot be used."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token of one request.

    ``temperature == 0`` is greedy; any other temperature must be in ``[MIN_TEMPERATURE, inf)``.
    ``top_k == 0`` and ``top_p == 1`` switch those filters off.
    ``seed`` makes a sampled request reproducible on its own, whatever else is in the batch.
    ``logprobs = N`` returns the chosen token's logprob and the N most likely tokens' (from the
    unfiltered distribution, as vLLM does; a grammar's mask is applied before, as in vLLM).
    ``prompt_logprobs = N`` returns, once the prompt is computed, each prompt token's logprob given
    the tokens before it (None for the first) with the N most likely alternatives, from the raw
    logits (no penalty, bias or grammar applies to the prompt), as vLLM's ``prompt_logprobs``.
    ``structured``: what the output must match (JSON Schema, regex, choice, grammar); decode
    engines mask each step's logits with it.
    Penalties, ``min_p``, ``min_tokens`` and ``logit_bias`` follow vLLM's formulas
    (`engine.logits_processors`): presence and frequency penalties count the output, the repetition
    penalty the prompt and the output; ``logit_bias`` is ``((token_id, bias), ...)``.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured: StructuredOutput | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        problems = [p for p in (*_check_floats(self), *_check_ints(self)) if p]
        if problems:
            raise SamplingError("bad sampling parameters: " + "; ".join(problems))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def processes_logits(self) -> bool:
        """Whether anything changes the logits before sampling (`engine.logits_processors`)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.min_tokens or self.logit_bias)


def _finite(name: str, value: object) -> str | None:
    """A problem when ``value`` is not a finite real number (NaN, inf, a string, an int past float)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return f"{name}={value!r} must be a number"
    try:
        if math.isfinite(float(value)):
            return None
    except OverflowError:  # an int too large for a float
        pass
    return f"{name}={value!r} must be a finite number"


def _check_floats(p: SamplingParams) -> list[str | None]:
    problems = [_finite("temperature", p.temperature), _finite("top_p", p.top_p)]
    for name, value, low, high in (("presence_penalty", p.presence_penalty, -2.0, 2.0),
                                   ("frequency_penalty", p.frequency_penalty, -2.0, 2.0),
                                   ("min_p", p.min_p, 0.0, 1.0)):
        problems.append(_finite(name, value) or (None if low <= value <= high else
                                                 f"{name}={value!r} must be in [{low}, {high}]"))
    rep = p.repetition_penalty
    problems.append(_finite("repetition_penalty", rep) or (None if 0 < rep <= 100 else
                                                           f"repetition_penalty={rep!r} must be in (0, 100]"))
    if problems[0] is None:
        t = p.temperature
        if t < 0 or 0 < t < MIN_TEMPERATURE:
            problems.append(f"temperature={t!r} must be 0 (greedy) or >= {MIN_TEMPERATURE} (MIN_TEMPERATURE)")
    if problems[1] is None and not 0 < p.top_p <= 1:
        problems.append(f"top_p={p.top_p!r} must be in (0, 1]")
    return problems


def _bounded(name: str, value: object, low: int, high: int, note: str = "") -> str | None:
    """A problem when ``value`` is not an int in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        return f"{name}={value!r} must be an integer"
    if not low <= int(value) <= high:  # int(): numbers.Integral declares no comparison
        return f"{name}={value!r} must be in [{low}, {high}]{note}"
    return None


def _check_ints(p: SamplingParams) -> list[str | None]:
    problems = [
        _bounded("max_tokens", p.max_tokens, 1, MAX_INT32),
        _bounded("top_k", p.top_k, 0, MAX_INT32, " (0 switches it off)"),
    ]
    if p.seed is not None:
        problems.append(_bounded("seed", p.seed, 0, MAX_SEED))
    if p.logprobs is not None:
        problems.append(_bounded("logprobs", p.logprobs, 0, MAX_INT32))
    if p.prompt_logprobs is not None:
        problems.append(_bounded("prompt_logprobs", p.prompt_logprobs, 0, MAX_INT32))
    problems.append(_bounded("min_tokens", p.min_tokens, 0, MAX_INT32))
    if isinstance(p.min_tokens, int) and isinstance(p.max_tokens, int) and p.min_tokens > p.max_tokens:
        problems.append(f"min_tokens={p.min_tokens} must not exceed max_tokens={p.max_tokens}")
    if not isinstance(p.logit_bias, (tuple, list)) or not all(
            isinstance(e, (tuple, list)) and len(e) == 2 and not _bounded("token", e[0], 0, MAX_INT32)
            and not _finite("bias", e[1]) and -100 <= e[1] <= 100 for e in p.logit_bias):
        problems.append(f"logit_bias={p.logit_bias!r} must be (token id, bias in [-100, 100]) pairs")
    if p.structured is not None and not isinstance(p.structured, StructuredOutput):
        problems.append(f"structured={p.structured!r} must be a StructuredOutput")
    if not isinstance(p.ignore_eos, bool):
        problems.append(f"ignore_eos={p.ignore_eos!r} must be true or false")
    if not isinstance(p.stop_token_ids, (tuple, list)):
        problems.append(f"stop_token_ids={p.stop_token_ids!r} must be a tuple of token ids")
    else:
        bad = [t for t in p.stop_token_ids if _bounded("stop_token_ids", t, 0, MAX_INT32)]
        if bad:
            problems.append(f"stop_token_ids={tuple(p.stop_token_ids)!r}: {bad[0]!r} is not a token id in "
                            f"[0, {MAX_INT32}]")
    return problems


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's logprob and, when asked, the top-N alternatives ``(token_id, logprob)``."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = field(default=())
