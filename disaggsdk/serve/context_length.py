"""How long a request may run: its prompt and output against the model's context.

Chat requests without ``max_tokens`` may generate the rest of the context (vLLM's default); a
request whose prompt and output cannot fit is a 400 that says by how much.
"""

from __future__ import annotations

import dataclasses

from disaggsdk.serve.openai_error import BadRequestError
from disaggsdk.serve.openai_request import ParsedRequest


def rest_of_context_by_default(req: ParsedRequest, max_model_len: int | None) -> ParsedRequest:
    """A chat request without max_tokens may generate the rest of the context, as vLLM's does."""
    if not req.chat or req.max_tokens_given or max_model_len is None or len(req.prompt_ids) >= max_model_len:
        return req
    rest = max(max_model_len - len(req.prompt_ids), req.params.min_tokens, 1)
    return dataclasses.replace(req, params=dataclasses.replace(req.params, max_tokens=rest))


def check_context_length(req: ParsedRequest, max_model_len: int | None) -> None:
    """Refuse a request whose prompt and output cannot fit the model's context (a 400 that says by how much).

    Raises:
        BadRequestError: prompt + max_tokens over ``max_model_len``.
    """
    total = len(req.prompt_ids) + req.params.max_tokens
    if max_model_len is None or total <= max_model_len:
        return
    over = total - max_model_len
    raise BadRequestError(
        f"this model's context is {max_model_len} tokens, but the request needs {total} "
        f"({len(req.prompt_ids)} of prompt + {req.params.max_tokens} of max_tokens): {over} too many; "
        f"shorten the prompt or lower max_tokens",
        param="max_tokens" if len(req.prompt_ids) < max_model_len else ("messages" if req.chat else "prompt"),
    )
