"""Acceptance counters of speculative decoding, per request and per engine (vLLM's metric meanings)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    """Counts since start.

    Attributes:
        num_drafts: verify steps that carried at least one draft (vllm:spec_decode_num_drafts).
        num_draft_tokens: draft tokens proposed (vllm:spec_decode_num_draft_tokens).
        num_accepted_tokens: draft tokens accepted (vllm:spec_decode_num_accepted_tokens).
        accepted_per_position: accepted drafts by position in the draft, 0 first
            (vllm:spec_decode_num_accepted_tokens_per_pos).
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafts_per_position: list[int] = field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        """Count one verify step of one request."""
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for counts, upto in ((self.drafts_per_position, num_draft_tokens), (self.accepted_per_position, num_accepted)):
            counts.extend([0] * (num_draft_tokens - len(counts)))
            for j in range(upto):
                counts[j] += 1

    def add(self, other: SpecStats) -> None:
        """Add another engine's counters to these (a deployment's total)."""
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for mine, theirs in ((self.accepted_per_position, other.accepted_per_position),
                             (self.drafts_per_position, other.drafts_per_position)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for j, n in enumerate(theirs):
                mine[j] += n

    def subtract(self, earlier: SpecStats) -> None:
        """Turn these counters into the ones since ``earlier`` (a snapshot of the same engines)."""
        self.add(SpecStats(-earlier.num_drafts, -earlier.num_draft_tokens, -earlier.num_accepted_tokens,
                           [-n for n in earlier.accepted_per_position], [-n for n in earlier.drafts_per_position]))

    @property
    def acceptance_rate(self) -> float:
        """Accepted over proposed draft tokens (0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verify step emits on average: accepted drafts plus the target's own token."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    def per_position_acceptance(self) -> list[float]:
        """For each draft position, the share of drafts there that were accepted."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafts_per_position)]

    def to_json(self) -> dict:
        """The counters and the derived rates, for bench output and logs."""
        return {"num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
                "num_accepted_tokens": self.num_accepted_tokens,
                "acceptance_rate": round(self.acceptance_rate, 4),
                "mean_accepted_length": round(self.mean_accepted_length, 4),
                "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance()]}
