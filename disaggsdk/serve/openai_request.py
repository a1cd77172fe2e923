"""OpenAI request bodies -> what the backend needs, with 400 errors that name the field.

Validation is by hand rather than with pydantic models so each message says exactly which
field is wrong and what would be accepted, in OpenAI's error shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from disaggsdk.engine.sampling import SamplingError, SamplingParams
from disaggsdk.errors import DisaggError

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy completions default
DEFAULT_CHAT_MAX_TOKENS = 256
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
# fields that change what the answer means: refused rather than silently ignored
UNSUPPORTED_FIELDS = ("tools", "functions", "tool_choice", "response_format", "logit_bias", "best_of", "suffix")
HARMLESS_VALUES = (None, [], {}, "", "none", {"type": "text"})  # the defaults clients send explicitly


class BadRequestError(DisaggError):
    """A request the server refuses. ``param`` names the offending field (OpenAI's ``param``)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.param = param
        self.status = status
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """The OpenAI-style JSON error body."""
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True)
class ParsedRequest:
    """One validated completion or chat request."""

    chat: bool
    prompt_ids: list[int]
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    logprobs: int | None  # top-N alternatives to return per token; None: no logprobs at all
    return_token_ids: bool  # extension (as vLLM's): each choice carries its token ids


def _typed(body: dict[str, Any], name: str, kinds: tuple[type, ...], default: Any, what: str) -> Any:
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int in Python; a JSON true is never a valid number here
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise BadRequestError(f"'{name}' must be {what}, got {value!r}", param=name)
    return value


def _stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequestError("'stop' must be a non-empty string or a list of them", param="stop")
    if len(stop) > MAX_STOP_STRINGS:
        raise BadRequestError(f"'stop' takes at most {MAX_STOP_STRINGS} strings", param="stop")
    return tuple(stop)


def _token_ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise BadRequestError(f"'{name}' must be a list of integer token ids", param=name)
    return list(value)


def _completion_prompt(body: dict[str, Any], encode: Callable[[str], list[int]]) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        raise BadRequestError("batched prompts are not supported; send one prompt per request", param="prompt")
    if isinstance(prompt, list):
        return _token_ids(prompt, "prompt")
    raise BadRequestError("'prompt' is required: a string or a list of token ids", param="prompt")


def render_chat(messages: Sequence[dict[str, Any]]) -> str:
    """The simple chat template used for models without one: ``<|role|>\\ncontent\\n`` per message,
    then ``<|assistant|>\\n`` for the reply.

    Raises:
        BadRequestError: malformed messages.
    """
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' must be a non-empty list of {role, content}", param="messages")
    parts = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "developer", "tool"):
            raise BadRequestError(f"messages[{i}].role must be system, user, assistant, developer or tool",
                                  param=f"messages[{i}].role")
        content = msg.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                raise BadRequestError(f"messages[{i}].content: only text parts are supported",
                                      param=f"messages[{i}].content")
            content = "".join(texts)
        if not isinstance(content, str):
            raise BadRequestError(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        parts.append(f"<|{msg['role']}|>\n{content}\n")
    return "".join(parts) + "<|assistant|>\n"


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    if chat:
        if not _typed(body, "logprobs", (bool,), False, "a boolean"):
            return None
        n = _typed(body, "top_logprobs", (int,), 0, "an integer")
        name = "top_logprobs"
    else:
        n = _typed(body, "logprobs", (int,), None, "an integer")
        name = "logprobs"
    if n is not None and not 0 <= n <= MAX_LOGPROBS:
        raise BadRequestError(f"'{name}' must be between 0 and {MAX_LOGPROBS}, got {n}", param=name)
    return n


def parse_request(body: Any, chat: bool, encode: Callable[[str], list[int]]) -> ParsedRequest:
    """Validate an OpenAI completions (``chat=False``) or chat completions body.

    Args:
        body: the decoded JSON body.
        chat: chat completions (``messages``) rather than completions (``prompt``).
        encode: text -> prompt token ids of the served model (BOS included where it has one).
    Returns:
        the parsed request.
    Raises:
        BadRequestError: naming the first bad field.
    """
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    if _typed(body, "n", (int,), 1, "an integer") != 1:
        raise BadRequestError("only n=1 is supported; send several requests instead", param="n")
    if body.get("echo"):
        raise BadRequestError("'echo' is not supported", param="echo")
    for name in UNSUPPORTED_FIELDS:
        if body.get(name) not in HARMLESS_VALUES and not (name == "best_of" and body[name] == 1):
            raise BadRequestError(f"'{name}' is not supported by this server; leave it out", param=name)
    for name in ("presence_penalty", "frequency_penalty"):
        if _typed(body, name, (int, float), 0, "a number"):
            raise BadRequestError(f"'{name}' is not supported; leave it at 0", param=name)
    if chat:
        text = render_chat(body.get("messages"))
        prompt_ids = encode(text)
        max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        default_max = DEFAULT_CHAT_MAX_TOKENS
    else:
        prompt_ids = _completion_prompt(body, encode)
        max_name, default_max = "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS
    if not prompt_ids:
        raise BadRequestError("the prompt is empty", param="messages" if chat else "prompt")
    max_tokens = _typed(body, max_name, (int,), default_max, "an integer")
    top_k = _typed(body, "top_k", (int,), 0, "an integer")
    fields = {
        "max_tokens": (max_name, max_tokens),
        "temperature": ("temperature", _typed(body, "temperature", (int, float), 1.0, "a number")),
        "top_p": ("top_p", _typed(body, "top_p", (int, float), 1.0, "a number")),
        "top_k": ("top_k", 0 if top_k == -1 else top_k),  # vLLM spells "off" as -1
        "seed": ("seed", _typed(body, "seed", (int,), None, "an integer")),
        "stop_token_ids": ("stop_token_ids", tuple(_token_ids(body.get("stop_token_ids") or [], "stop_token_ids"))),
        "ignore_eos": ("ignore_eos", _typed(body, "ignore_eos", (bool,), False, "a boolean")),
    }
    logprobs = _logprobs(body, chat)
    try:
        params = SamplingParams(**{k: v for k, (_, v) in fields.items()}, logprobs=logprobs)
    except SamplingError as exc:
        bad = next((field for k, (field, _) in fields.items() if f"{k}=" in str(exc)), None)
        raise BadRequestError(str(exc), param=bad) from None
    options = _typed(body, "stream_options", (dict,), {}, "an object")
    stream = _typed(body, "stream", (bool,), False, "a boolean")
    return ParsedRequest(
        chat=chat, prompt_ids=prompt_ids, params=params, stop=_stop_strings(body), stream=stream,
        include_usage=bool(options.get("include_usage")) and stream, logprobs=logprobs,
        return_token_ids=_typed(body, "return_token_ids", (bool,), False, "a boolean"),
    )
