"""vLLM's utility endpoints: ``POST /tokenize``, ``POST /detokenize`` and ``GET /version``.

``/tokenize`` takes ``{prompt}`` or, as vLLM's, ``{messages, add_generation_prompt, tools,
chat_template_kwargs}`` (rendered exactly as a chat request would be) and answers ``{count,
max_model_len, tokens}``; ``/detokenize`` takes ``{tokens}`` and answers ``{prompt}``. Bad bodies
get the same OpenAI error objects as the completion endpoints. Unlike vLLM's, ``/tokenize`` refuses
(400) a text whose length alone shows that it cannot fit the model's context, without tokenizing it
(`serve.model_tokenizer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI, Request

from disaggsdk.serve.http.chat_request import chat_prompt
from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.openai_json import JsonObject, check_json_tree, decode_body

if TYPE_CHECKING:
    from disaggsdk.serve.backend import ServingBackend
    from disaggsdk.serve.http.chat_template import ChatTemplate


def _token_list(body: JsonObject, vocab_size: int | None) -> list[int]:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise BadRequestError("'tokens' must be a list of integer token ids", param="tokens")
    bad = next((t for t in tokens if t < 0 or (vocab_size is not None and t >= vocab_size)), None)
    if bad is not None:
        raise BadRequestError(f"'tokens': {bad} is not a token id of this model (0 .. {vocab_size})",
                              param="tokens")
    return tokens


def _installed_version() -> str:
    # the package metadata, not `disaggsdk.__version__`: the front end sits below the package's face
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("disaggsdk")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


def model_vocab_size(model: str) -> int | None:
    """The served model's vocabulary size, None for a model the catalog cannot resolve."""
    from disaggsdk.errors import ModelError
    from disaggsdk.models import resolve_model

    try:
        return resolve_model(model).vocab_size
    except ModelError:  # a backend serving something the catalog does not know: no range check
        return None


def add_tokenize_routes(app: FastAPI, router: APIRouter, backend: ServingBackend,
                        chat_template: ChatTemplate | None, read: Callable[[Request], Awaitable[bytes]]) -> None:
    """Register the three endpoints: /version on ``app``, the others beside /v1 (``router``'s
    checks, the API key included, apply), as vLLM serves them at the root.

    Args:
        read: ``request -> body bytes`` with the server's size limit.
    (FastAPI reads the handlers' annotations by name, so `Request` is imported at module level.)
    """
    max_model_len = backend.max_model_len
    vocab_size = model_vocab_size(backend.model_name)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": _installed_version()}

    def tokens_of(body: JsonObject) -> list[int]:
        if "messages" in body:
            return backend.encode(chat_prompt(body, chat_template))
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return backend.encode(prompt)
        raise BadRequestError("give 'prompt' (a string) or 'messages'", param="prompt")

    @router.post("/tokenize")
    async def tokenize(request: Request) -> JsonObject:
        body = decode_body(await read(request))
        if not isinstance(body, dict):
            raise BadRequestError("the request body must be a JSON object")
        check_json_tree(body)
        # on a worker thread, as a completion's prompt: a megabyte prompt takes seconds to render and
        # tokenize, and every other client's stream shares this event loop
        tokens = await asyncio.to_thread(tokens_of, body)
        return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens}

    @router.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, str]:
        body = decode_body(await read(request))
        if not isinstance(body, dict):
            raise BadRequestError("the request body must be a JSON object")
        return {"prompt": backend.decode(_token_list(body, vocab_size))}
