"""OpenAI response bodies (whole and streamed chunks) for completions and chat completions.

Pure functions of what one request produced; the app decides when to send them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from disaggsdk.serve.http.openai_json import JsonObject

if TYPE_CHECKING:
    from disaggsdk.engine.sampling_params import TokenLogprobs

Decode = Callable[[Sequence[int]], str]
# a ``logprobs`` object: chat's {"content": [...]}, or completions' parallel lists ("tokens", ...)
LogprobsObject = dict[str, list[object]]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> JsonObject:
    """The ``usage`` object. ``prompt_tokens_details.cached_tokens`` (prompt tokens a prefix cache
    served) is always there, 0 included, as OpenAI answers; vLLM adds it only with
    ``--enable-prompt-tokens-details`` and a non-zero count."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def completion_logprobs(lps: Sequence[TokenLogprobs], decode: Decode, text_offset: int) -> LogprobsObject:
    """The legacy completions ``logprobs`` object of some tokens.

    Args:
        lps: logprobs of each token, in order.
        decode: token ids -> text.
        text_offset: where the first token's text starts in the completion text.
    """
    tokens = [decode([lp.token_id]) for lp in lps]
    offsets: list[object] = []
    for token in tokens:
        offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": list(tokens),
        "token_logprobs": [lp.logprob for lp in lps],
        "top_logprobs": [{decode([t]): v for t, v in lp.top} for lp in lps],
        "text_offset": offsets,
    }


def prompt_logprobs(prompt_ids: Sequence[int], lps: Sequence[TokenLogprobs | None], decode: Decode) -> LogprobsObject:
    """The legacy completions ``logprobs`` object of an echoed prompt: each token's logprob given the
    ones before it (null for the first, as OpenAI and vLLM answer), offsets from the text's start."""
    first = decode(prompt_ids[:1])
    scored = [lp for lp in lps[1:] if lp is not None]
    assert len(scored) == len(lps) - 1, "only a prompt's first token has no logprob"
    whole = completion_logprobs(scored, decode, len(first))
    return {"tokens": [first, *whole["tokens"]], "token_logprobs": [None, *whole["token_logprobs"]],
            "top_logprobs": [None, *whole["top_logprobs"]], "text_offset": [0, *whole["text_offset"]]}


def chat_logprobs(lps: Sequence[TokenLogprobs], decode: Decode) -> LogprobsObject:
    """The chat ``logprobs`` object (``{"content": [...]}``) of some tokens."""

    def entry(token_id: int, logprob: float) -> JsonObject:
        token = decode([token_id])
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    return {"content": [entry(lp.token_id, lp.logprob) | {"top_logprobs": [entry(t, v) for t, v in lp.top]}
                        for lp in lps]}


def choice(chat: bool, text: str, finish_reason: str | None, logprobs: LogprobsObject | None,
           token_ids: Sequence[int] | None, delta: bool, first: bool = False,
           tool_calls: Sequence[JsonObject] = ()) -> JsonObject:
    """One ``choices[0]`` entry: a whole answer or a streamed delta.

    Args:
        chat: chat completions shape (``message``/``delta``) rather than ``text``.
        text: the (new) text.
        finish_reason: None until the last chunk.
        logprobs: the logprobs object or None.
        token_ids: the (new) token ids when the client asked for them (``return_token_ids``).
        delta: a streamed chunk rather than the whole answer.
        first: the first chat chunk, which carries the assistant role.
        tool_calls: the answer's tool calls (chat). Streamed, the calls completed since the last
            chunk, each with its ``index``; whole, all of them (the content is null when there
            are calls and no text).
    """
    out: JsonObject = {"index": 0}
    if not chat:
        out["text"] = text
    elif delta:
        changes: JsonObject = {"role": "assistant"} if first else {}
        changes["content"] = text
        if tool_calls:
            changes["tool_calls"] = list(tool_calls)
        out["delta"] = changes
    else:
        message: JsonObject = {"role": "assistant", "content": text or (None if tool_calls else text)}
        if tool_calls:
            message["tool_calls"] = list(tool_calls)
        out["message"] = message
    out["logprobs"] = logprobs
    out["finish_reason"] = finish_reason
    if token_ids is not None:
        out["token_ids"] = list(token_ids)
    return out


def body(chat: bool, request_id: str, created: int, model: str, choices: list[JsonObject],
         chunk: bool, usage_: JsonObject | None = None) -> JsonObject:
    """A whole response or one SSE chunk around ``choices``."""
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    out: JsonObject = {"id": request_id, "object": kind, "created": created, "model": model, "choices": choices}
    if usage_ is not None:
        out["usage"] = usage_
    return out


def merge_logprobs(parts: list[LogprobsObject], chat: bool) -> LogprobsObject | None:
    """One choice's logprobs objects of its pieces, as one."""
    if not parts:
        return None
    if chat:
        return {"content": [c for p in parts for c in p["content"]]}
    return {key: [x for p in parts for x in p[key]] for key in ("tokens", "token_logprobs", "top_logprobs",
                                                                "text_offset")}
