"""Joins a request's prompt logprobs, which come from the unit that computed its prompt, with the
token events its decode unit streams (disaggregated deployments).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from disaggsdk.serve.backend import TokenEvent

if TYPE_CHECKING:
    from disaggsdk.engine.sampling_params import SamplingParams, TokenLogprobs


class PromptLogprobsJoin:
    """Per-request holding of token events until the prompt's logprobs are there (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, list[TokenEvent]] = {}  # requests still waiting for their scores
        self._early: dict[str, Sequence[TokenLogprobs | None]] = {}  # scores that came before any event

    def expect(self, request_id: str, params: SamplingParams) -> None:
        """Note a request just sent; only those with ``params.prompt_logprobs`` wait for scores."""
        if params.prompt_logprobs is not None:
            with self._lock:
                self._held[request_id] = []

    def scores(self, request_id: str, logprobs: Sequence[TokenLogprobs | None]) -> list[TokenEvent]:
        """The prompt's scores arrived: returns the held events to deliver now (the first carries them)."""
        with self._lock:
            held = self._held.pop(request_id, None)
            if held is None:  # not waiting (already joined, ended, or not asked): late duplicates drop
                return []
            if not held:
                self._early[request_id] = logprobs
                return []
        held[0] = dataclasses.replace(held[0], prompt_logprobs=list(logprobs))
        return held

    def event(self, event: TokenEvent) -> list[TokenEvent]:
        """A token event arrived: returns the events to deliver now (none while still waiting)."""
        rid = event.request_id
        with self._lock:
            early = self._early.pop(rid, None)
            if early is not None:
                return [dataclasses.replace(event, prompt_logprobs=list(early))]
            held = self._held.get(rid)
            if held is None:
                return [event]
            if event.prompt_logprobs is not None or event.finish_reason in ("error", "abort"):
                del self._held[rid]
                events = [*held, event]
                if event.prompt_logprobs is not None and held:  # the scores go on the first event
                    events[0] = dataclasses.replace(held[0], prompt_logprobs=event.prompt_logprobs)
                    events[-1] = dataclasses.replace(event, prompt_logprobs=None)
                return events
            held.append(event)
            return []

    def forget(self, request_id: str) -> None:
        """The request ended without the join (its unit died, the router closed)."""
        with self._lock:
            self._held.pop(request_id, None)
            self._early.pop(request_id, None)
