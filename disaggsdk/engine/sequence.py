"""One request's state inside the engine, and what a step reports about it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disaggsdk.engine.sampling_params import SamplingParams, TokenLogprobs

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.structured.grammar import GrammarState


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # no KV yet (new, or preempted and waiting to be recomputed)
    RUNNING = "running"  # holds pages; prefilling in chunks or decoding
    FINISHED = "finished"


@dataclass
class Request:
    """A request as the scheduler sees it.

    Tokens are ``prompt_ids + output_ids``; the first ``num_computed_tokens`` of them have KV in
    the request's pages. The next step computes some of the rest: a chunk of the prompt
    (prefill) or the one newest token (decode).
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[TokenLogprobs] = field(default_factory=list)
    # with params.prompt_logprobs: entry i is prompt token i's (None for token 0), filled chunk by chunk
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=lambda: [None])
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "prefilled" | "error"
    error: str | None = None  # with finish_reason "error": what went wrong, for the client
    num_preemptions: int = 0
    draft_ids: list[int] = field(default_factory=list)  # speculative drafts its next step verifies
    num_draft_tokens: int = 0  # drafts proposed for it, in total
    num_accepted_tokens: int = 0  # of which accepted
    grammar: GrammarState | None = None  # its structured output's matcher (decoding engines only)
    # the prefix cache: hashes of its full pages so far, how many of its pages were offered to the
    # cache, and how many prompt tokens its first admission found cached (usage's cached_tokens)
    page_hashes: list[bytes] = field(default_factory=list)
    num_pages_cached: int = 0
    num_cached_tokens: int = 0

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass
class RequestOutput:
    """What one step produced for one request.

    ``hidden_state`` and ``logits`` are those of the last position computed this step, given when
    the engine was asked to return them (the messenger's context payload after prefill).
    """

    request_id: str
    new_token_ids: list[int]
    output_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None  # with finish_reason "error"
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)
    # the whole prompt's logprobs (entry 0 None), given once: in the step that computed the last of them
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served (not computed here)
    hidden_state: torch.Tensor | None = None  # [hidden_size], float32, CPU
    logits: torch.Tensor | None = None  # [vocab_size], float32, CPU
