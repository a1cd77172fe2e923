"""A request's handoff state on the decode side, and the quarantine of ended attempts."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from disaggsdk.messenger.stats import RequestTransfer


@dataclass
class Handoff:
    """One request on the decode side until its KV arrived: the current attempt and what was tried."""

    request_id: str
    prompt_ids: list[int]
    params: Any  # SamplingParams
    attempt: int = 0
    prefill: str | None = None
    tried: set[str] = field(default_factory=set)
    imm: int = 0
    grant: Any = None  # PageGrant of the current attempt
    slot: int = -1
    counter: Future | None = None
    fired_at: float = 0.0
    send_future: Future | None = None
    deadline: float = 0.0
    submitted_s: float = 0.0  # time.monotonic() when the request reached this unit
    sent_s: float = 0.0  # ... when the current attempt's prefill request was sent

    def record(self, forward_end_s: float, admitted_s: float) -> RequestTransfer:
        """The measurements of a request whose KV arrived (``forward_end_s``: prefill's, from the context)."""
        fired = self.fired_at or admitted_s
        return RequestTransfer(self.request_id, "decode", len(self.prompt_ids),
                               exposed_s=max(0.0, fired - forward_end_s), attempts=self.attempt,
                               forward_end_s=forward_end_s, submitted_s=self.submitted_s, sent_s=self.sent_s,
                               fired_s=fired, admitted_s=admitted_s)


@dataclass
class Quarantine:
    """Pages (and a context slot) of an ended attempt, held until no write of it can still land."""

    owner: str  # allocator owner holding the pages
    slot: int
    prefill: str
    request_id: str
    generation: int
    release_at: float | None = None  # None: wait for the prefill unit's drain report
