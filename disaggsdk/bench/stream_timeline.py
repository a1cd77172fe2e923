"""What one streamed request saw, counted the way vLLM's ``bench serve`` counts it.

vLLM times SSE chunks, not tokens: every chunk whose ``choices`` is non-empty is one event (its
text may be empty, e.g. a special token), TTFT is the first event, ITL the gaps between events
(one per chunk, however many tokens it carries), the latency the last event, and the output
length the server's ``usage.completion_tokens``. Keeping that definition here makes our medians
comparable with vLLM's when a server batches several tokens into one chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from disaggsdk.report.latency import RequestTimeline


@dataclass
class StreamTimeline(RequestTimeline):
    """A `RequestTimeline` whose ``token_times_s`` holds one time per streamed chunk, not per token.

    ``summarize`` reads it unchanged: ``itls_ms`` become per-chunk gaps, ``e2el_ms`` ends at the
    last chunk, and ``tpot_ms`` is vLLM's ``(latency - ttft) / (output_tokens - 1)`` with the
    output length below.
    """

    usage_output_tokens: int | None = None  # the server's usage.completion_tokens, when it sent one
    # the output token ids the chunks carried, in order (a server that honours return_token_ids)
    output_token_ids: list[int] = field(default_factory=list)
    generated_text: str = ""
    # prompt tokens the server's prefix cache served (usage.prompt_tokens_details.cached_tokens:
    # vLLM with --enable-prompt-tokens-details); None when the server did not say
    cached_tokens: int | None = None

    @property
    def output_tokens(self) -> int:
        """Output length as vLLM takes it: the usage count, else the tagged ids, else one per chunk."""
        if self.usage_output_tokens:
            return self.usage_output_tokens
        return len(self.output_token_ids) or len(self.token_times_s)

    @property
    def latency_s(self) -> float:
        """Seconds from the send to the last chunk (vLLM's ``latency``); 0.0 for a failed request."""
        return self.token_times_s[-1] - self.sent_s if self.ok else 0.0

    def add_chunk(self, chunk: dict[str, Any], chat: bool, now_s: float | None = None) -> None:
        """Record one parsed SSE ``data:`` object received at ``now_s`` (default: now).

        Args:
            chunk: the decoded JSON of one event.
            chat: the chat completions shape (``delta.content``) rather than ``text``.
            now_s: the arrival time on the timeline's clock.
        """
        now_s = time.perf_counter() if now_s is None else now_s
        if "error" in chunk:
            error = chunk["error"]
            self.error = str(error.get("message", error) if isinstance(error, dict) else error)
        choices = chunk.get("choices")
        if choices:  # a usage-only chunk has "choices": [] and carries no token
            first = choices[0]
            text = (first.get("delta") or {}).get("content") if chat else first.get("text")
            self.generated_text += text or ""
            self.output_token_ids.extend(first.get("token_ids") or ())
            self.token_times_s.append(now_s)
        usage = chunk.get("usage")
        if usage:
            self.usage_output_tokens = usage.get("completion_tokens") or self.usage_output_tokens
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            details = usage.get("prompt_tokens_details") or {}  # servers send null without the option
            if details.get("cached_tokens") is not None:
                self.cached_tokens = details["cached_tokens"]
