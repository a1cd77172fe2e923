"""What speculation an engine runs: `SpeculativeConfig` (vLLM's names where it has them)."""

from __future__ import annotations

from dataclasses import dataclass

from disaggsdk.errors import DisaggError

SPEC_METHODS = ("mtp", "ngram")
MAX_DRAFT_TOKENS = 4


class SpeculativeConfigError(DisaggError):
    """A speculative-decoding setting the engine cannot run."""


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    Attributes:
        method: "mtp" (the model's own multi-token-prediction layer drafts, chained for
            num_tokens > 1) or "ngram" (prompt lookup: the tokens that followed the latest earlier
            occurrence of the sequence's last n tokens; any model).
        num_tokens: drafts per request per step, 1..4 (vLLM's num_speculative_tokens).
        prompt_lookup_min, prompt_lookup_max: n-gram sizes tried, longest first (ngram only).
    """

    method: str
    num_tokens: int = 1
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise SpeculativeConfigError(f"unknown speculative method {self.method!r}; use one of {SPEC_METHODS}")
        if not 1 <= self.num_tokens <= MAX_DRAFT_TOKENS:
            raise SpeculativeConfigError(
                f"speculative num_tokens must be in [1, {MAX_DRAFT_TOKENS}], got {self.num_tokens}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise SpeculativeConfigError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {self.prompt_lookup_min} and "
                f"{self.prompt_lookup_max}")
