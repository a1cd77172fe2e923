"""One engine step's work, as the simulator hands it to a step cost: the seam between the scheduler
model (`instance.SimInstance`) and what prices a step.

Two costs implement `StepCost`: `cost_model.StepCostModel` (whole blocks from a profile's rates; the
CPU path, calibrated on the machine, whose figures do not move) and `engine_step.EngineStep` (the
kernels a GPU engine runs, priced one by one from measured tables or the roofline).
"""

from __future__ import annotations

from typing import Protocol

import attrs


@attrs.frozen
class StepBatch:
    """The work of one forward step of a whole instance (every dp group together).

    ``decode_seqs`` sequences decode ``tokens_per_decode_seq`` tokens each (1; 2 with MTP, which
    verifies one draft token) after ``decode_context_tokens`` tokens of KV together; each prefill chunk
    computes ``new`` prompt tokens after ``cached`` ones already in the KV cache (earlier chunks of
    its prompt, or a prefix-cache hit).
    """

    decode_seqs: int = 0
    decode_context_tokens: float = 0.0
    tokens_per_decode_seq: int = 1
    chunks: tuple[tuple[int, int], ...] = ()  # (new, cached) tokens per prefill chunk

    @property
    def decode_tokens(self) -> int:
        return self.decode_seqs * self.tokens_per_decode_seq

    @property
    def num_tokens(self) -> int:
        """New tokens the step computes: decode tokens and prefill chunk tokens."""
        return self.decode_tokens + sum(new for new, _ in self.chunks)

    @property
    def num_sequences(self) -> int:
        """Requests in the step (one logits row each)."""
        return self.decode_seqs + len(self.chunks)

    @property
    def context_pairs(self) -> float:
        """Sum over new tokens of the context each attends to: a decode token at length L adds L (as
        the cost model has always counted it, whatever the MTP tokens), a prefill chunk of c tokens
        after p cached adds c*p + c*(c+1)/2."""
        pairs = float(self.decode_context_tokens)
        for new, cached in self.chunks:
            pairs += new * cached + new * (new + 1) / 2
        return pairs

    @property
    def kv_read_tokens(self) -> float:
        """Tokens of KV read: each decoding sequence's context, each chunk's cached and new tokens."""
        tokens = float(self.decode_context_tokens)
        for new, cached in self.chunks:
            tokens += cached + new
        return tokens


class StepCost(Protocol):
    """What prices a step of one instance."""

    def batch_time_s(self, batch: StepBatch) -> float:
        """Wall time of the step, seconds."""
        ...
