"""One request in flight at the front end: backend events -> text pieces, timeline, metrics.

The app wraps a `RequestRun` in either a streamed (SSE) or a whole response; both share the
token accounting here, so /metrics sees every request the same way.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass, field

from disaggsdk.report.latency import RequestTimeline
from disaggsdk.serve.backend import ServingBackend, TokenEvent
from disaggsdk.serve.http import openai_response as resp
from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.openai_json import JsonObject
from disaggsdk.serve.http.openai_request import ParsedRequest
from disaggsdk.serve.http.text_stream import TextStream
from disaggsdk.serve.http.tool_calls import parse_calls
from disaggsdk.serve.metrics import ServerMetrics


@dataclass
class Piece:
    """What one backend event became: new text and the choice entry to send for it (with the new
    token ids and logprobs object it holds, for a whole answer to gather)."""

    text: str
    choice: JsonObject
    finished: bool
    token_ids: list[int] = field(default_factory=list)
    logprobs: resp.LogprobsObject | None = None


@dataclass
class RequestRun:
    """Drives one request through the backend and accounts for it exactly once."""

    backend: ServingBackend
    metrics: ServerMetrics
    request_id: str  # its key in the backend, never sent to the client (`serve.http.client_request_ids`)
    req: ParsedRequest
    model: str
    client: str = ""  # who sent it: the client's address (`ServingBackend.generate`)
    # the client's W3C trace-context headers (`ServingBackend.generate`); empty: it sent none
    trace_context: Mapping[str, str] = field(default_factory=dict)
    response_id: str = ""  # the answer's id, what the client knows it by ("": request_id is)
    created: int = field(default_factory=lambda: int(time.time()))
    timeline: RequestTimeline = field(init=False)
    error: str | None = None
    finish_reason: str | None = None
    _instance: str = ""
    prefill_instance: str = ""  # the prefill instance that computed its prompt ("": none did)
    _events: AsyncGenerator[TokenEvent, None] | None = None  # from start() on
    _text: TextStream = field(init=False)
    _first_chunk: bool = True
    _recorded: bool = False
    tool_calls: list[JsonObject] = field(default_factory=list)  # parsed as each call completes
    _tool_ids: list[int] | None = None  # output from the first <tool_call> on (never sent as text)
    _echo_text: str = ""  # the echoed prompt, sent before the output (completions with echo)

    def __post_init__(self) -> None:
        self.timeline = RequestTimeline(time.monotonic(), prompt_tokens=len(self.req.prompt_ids))
        decode = functools.partial(self.backend.decode, skip_special_tokens=self.req.skip_special_tokens)
        self._text = TextStream(decode, self.req.stop, self.req.include_stop_str_in_output)

    @property
    def instance(self) -> str:
        """The decode (or mixed) instance that produced its tokens ("" before any came)."""
        return self._instance

    @property
    def completion_tokens(self) -> int:
        return len(self._text.token_ids) + len(self._tool_ids or ())

    @property
    def text(self) -> str:
        return self._echo_text + self._text.sent_text

    async def start(self) -> TokenEvent:
        """Submit the request and wait for its first event.

        Raises:
            BadRequestError: the backend refused the request before producing a token (400), or
                no instance that produces tokens is up or routable (503, with ``Retry-After`` when the
                backend says when to try again).
        """
        if self.trace_context:
            self._events = self.backend.generate(self.request_id, self.req.prompt_ids, self.req.params, self.client,
                                                 trace_context=self.trace_context, response_id=self.response_id)
        else:
            self._events = self.backend.generate(self.request_id, self.req.prompt_ids, self.req.params, self.client,
                                                 response_id=self.response_id)
        first = await anext(self._events)
        if first.finish_reason == "error" and not first.new_token_ids:
            self.error = self._public(first.error) or "the request failed"
            self.finish_reason = "error"
            self.record()
            if first.retry_after_s is not None:
                retry_after_s = max(1, math.ceil(first.retry_after_s))
                raise BadRequestError(f"no serving instance can take the request now: {self.error}; retry after "
                                      f"{retry_after_s} s", status=503, kind="server_error",
                                      headers={"Retry-After": str(retry_after_s)})
            if not any(s.healthy for s in self.backend.stats() if s.role in ("decode", "mixed")):
                raise BadRequestError(f"no serving instance is up: {self.error}", status=503, kind="server_error")
            raise BadRequestError(self.error, param=None)
        return first

    async def abandon(self) -> None:
        """The client left before the first event: abort the request in the backend, count an abort."""
        await self.backend.abort(self.request_id)
        if self._events is not None:
            await self._events.aclose()
        self.finish_reason = self.finish_reason or "abort"
        self.record()

    async def pieces(self, first: TokenEvent) -> AsyncIterator[Piece]:
        """The request's output, one piece per backend event, starting with ``first`` (after `start`)."""
        assert self._events is not None, "start() gave the first event"
        event: TokenEvent | None = first
        try:
            while event is not None:
                piece = self._take(event)
                yield piece
                if piece.finished:
                    return
                event = await anext(self._events, None)
            self.error, self.finish_reason = "the backend ended the stream without finishing", "error"
        finally:
            if self.finish_reason is None or self._text.stopped:
                # stopped on a stop string or the client went away: the backend must let go too
                await self.backend.abort(self.request_id)
                self.finish_reason = self.finish_reason or "abort"
            await self._events.aclose()
            self.record()

    def _take(self, event: TokenEvent) -> Piece:
        now = time.monotonic()
        self._instance = event.instance or self._instance
        self.prefill_instance = event.prefill_instance or self.prefill_instance
        tokens = [] if self.req.echo_only else list(event.new_token_ids)  # the one token made is dropped
        self.timeline.token_times_s.extend([now] * len(tokens))
        echo = self._echo(event) if self._first_chunk else ""
        offset = len(self.text)
        text = echo + self._text.add(self._split_tool_calls(tokens), final=event.finished)
        new_calls = self._new_tool_calls()
        finished = event.finished or self._text.stopped
        if finished:
            self.finish_reason = "stop" if self._text.stopped else event.finish_reason
            self.error = self._public(event.error) if event.finish_reason == "error" else None
            if self.tool_calls and self.finish_reason == "stop":
                self.finish_reason = "tool_calls"
        parts = []
        if echo and self.req.logprobs is not None and event.prompt_logprobs is not None:  # `_echo` checked it came
            parts.append(resp.prompt_logprobs(self.req.prompt_ids, event.prompt_logprobs, self.backend.decode))
        if self.req.logprobs is not None and event.new_logprobs and tokens:
            lps = list(event.new_logprobs)
            parts.append(resp.chat_logprobs(lps, self.backend.decode) if self.req.chat
                         else resp.completion_logprobs(lps, self.backend.decode, offset))
        logprobs = resp.merge_logprobs(parts, self.req.chat)
        choice = resp.choice(
            self.req.chat, text, self.finish_reason if finished else None, logprobs,
            tokens if self.req.return_token_ids else None, delta=True, first=self._first_chunk,
            tool_calls=new_calls,
        )
        self._first_chunk = False
        return Piece(text, choice, finished, tokens, logprobs)

    def _public(self, error: str | None) -> str | None:
        """A backend's error as the client may read it: the request named by its response id, not its key
        (a unit's message names the request it refuses by the only id it knows)."""
        if error is None or not self.response_id:
            return error
        return error.replace(self.request_id, self.response_id)

    def _echo(self, event: TokenEvent) -> str:
        """The prompt's text, which an echo request's answer starts with ("" without echo).

        Raises:
            BadRequestError (500): the prompt's logprobs were asked for and did not come (a backend
                that cannot score prompts must refuse such requests, never answer without them).
        """
        if not self.req.echo:
            return ""
        if self.req.logprobs is not None and event.prompt_logprobs is None:
            raise BadRequestError("the prompt's logprobs did not come with its first tokens", status=500,
                                  kind="server_error")
        self._echo_text = self.backend.decode(self.req.prompt_ids, skip_special_tokens=self.req.skip_special_tokens)
        return self._echo_text

    def _split_tool_calls(self, tokens: list[int]) -> list[int]:
        """The tokens that are message text; from the first <tool_call> on they are kept aside."""
        setup = self.req.tool_setup
        if setup is None:
            return tokens
        if self._tool_ids is None and setup.open_id in tokens:
            cut = tokens.index(setup.open_id)
            self._tool_ids, tokens = tokens[cut:], tokens[:cut]
        elif self._tool_ids is not None:
            self._tool_ids, tokens = self._tool_ids + tokens, []
        return tokens

    def _new_tool_calls(self) -> list[JsonObject]:
        """The calls completed since the last event (as stream deltas, with their index): each call
        goes out whole in the chunk where its </function> arrives, not at the end of the answer."""
        if not self._tool_ids or self.req.tool_setup is None:  # tool ids are kept aside only with a setup
            return []
        calls = parse_calls(self.backend.decode(self._tool_ids), self.req.tool_setup)
        new = calls[len(self.tool_calls):]  # completed blocks never change: ids stay those already sent
        self.tool_calls.extend(new)
        return [{"index": len(self.tool_calls) - len(new) + i} | c for i, c in enumerate(new)]

    def record(self) -> None:
        """Account the request in the metrics (once)."""
        if not self._recorded:
            self._recorded = True
            self.timeline.error = self.error
            self.metrics.record(self.timeline, self._instance, self.finish_reason)
