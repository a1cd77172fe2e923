"""One benchmark request over HTTP: the payload for an endpoint, streamed into a `StreamTimeline`.

The payloads are the ones vLLM's ``bench serve`` sends (``openai`` backend to /v1/completions,
``openai-chat`` to /v1/chat/completions: one user message, ``max_completion_tokens``); token ids
in every chunk, server work vLLM's client does not ask for, only where a run compares outputs
(``return_token_ids``). Output lengths come from the final ``usage``, as vLLM's client takes them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from disaggsdk.bench.dataset import BenchRequest
from disaggsdk.bench.stream_timeline import StreamTimeline
from disaggsdk.errors import DisaggError

COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT_COMPLETIONS)
BACKEND_OF_ENDPOINT = {COMPLETIONS: "openai", CHAT_COMPLETIONS: "openai-chat"}  # vLLM's --backend names
ERROR_BODY_CHARS = 300


class RequestOptionsError(DisaggError):
    """Request settings the benchmark cannot send."""


@dataclass(frozen=True)
class RequestOptions:
    """What every benchmark request asks for, besides its prompt and length.

    Raises:
        RequestOptionsError: an endpoint other than /v1/completions or /v1/chat/completions.
    """

    endpoint: str = COMPLETIONS
    temperature: float | None = 0.0  # None: leave it to the server (vLLM's default since 0.11)
    ignore_eos: bool = True  # outputs run to their asked length, so lengths and TPOT are comparable
    # ask for each chunk's token ids (vLLM's and our extension): what two runs' outputs are compared
    # by, token for token; off by default, as vLLM's client sends it
    return_token_ids: bool = False

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise RequestOptionsError(f"--endpoint {self.endpoint!r}: use one of {', '.join(ENDPOINTS)}")

    @property
    def chat(self) -> bool:
        """Whether requests go to the chat endpoint."""
        return self.endpoint == CHAT_COMPLETIONS

    @property
    def backend(self) -> str:
        """vLLM's name for this request shape (``openai`` or ``openai-chat``)."""
        return BACKEND_OF_ENDPOINT[self.endpoint]


DEFAULT_REQUEST_OPTIONS = RequestOptions()  # completions, greedy, outputs to their asked length


def payload(model: str, req: BenchRequest, options: RequestOptions) -> dict[str, Any]:
    """The JSON body of one streamed request.

    Raises:
        RequestOptionsError: a token-id prompt for the chat endpoint (a message needs text).
    """
    body: dict[str, Any] = {"model": model, "stream": True, "stream_options": {"include_usage": True}}
    if options.chat:
        if not isinstance(req.prompt, str):
            raise RequestOptionsError("the chat endpoint needs text prompts: decode token-id prompts first")
        body |= {"messages": [{"role": "user", "content": req.prompt}], "max_completion_tokens": req.output_len}
    else:
        body |= {"prompt": req.prompt, "max_tokens": req.output_len}
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if options.ignore_eos:
        body["ignore_eos"] = True
    if options.return_token_ids:
        body["return_token_ids"] = True
    return body


def headers(api_key: str | None) -> dict[str, str]:
    """The bearer header for ``api_key`` (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def send(client: httpx.AsyncClient, url: str, model: str, req: BenchRequest, options: RequestOptions,
               api_key: str | None = None) -> StreamTimeline:
    """Send ``req`` to ``url + options.endpoint`` and time its stream.

    Returns:
        the request's timeline; a failure (HTTP status, broken stream, error event, no chunk)
        is in its ``error``, never raised.
    """
    body = payload(model, req, options)
    t = StreamTimeline(time.perf_counter(), prompt_tokens=req.prompt_len)
    try:
        async with client.stream("POST", f"{url}{options.endpoint}", json=body, headers=headers(api_key)) as r:
            if r.status_code != 200:
                t.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:ERROR_BODY_CHARS]}"
                return t
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators and ": ping" comments
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    continue
                now_s = time.perf_counter()
                t.add_chunk(json.loads(data), options.chat, now_s)
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a chunk that is not JSON
        t.error = f"{type(exc).__name__}: {exc}"
    if t.error is None and not t.token_times_s:
        t.error = "the stream carried no chunk with a choice (vLLM counts such a request as failed)"
    return t
