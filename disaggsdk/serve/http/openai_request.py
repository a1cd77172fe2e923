"""OpenAI request bodies -> what the backend needs, with 400 errors that name the field."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from disaggsdk.engine.sampling_params import MAX_INT32, MAX_SEED, MIN_TEMPERATURE, SamplingError, SamplingParams
from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError
from disaggsdk.serve.http.chat_request import chat_prompt, check_tools
from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.openai_json import JsonObject, check_json_tree, show_value
from disaggsdk.serve.http.structured_request import parse_structured
from disaggsdk.serve.http.tool_calls import ToolSetup, forced_calls, parse_tool_choice

if TYPE_CHECKING:
    from disaggsdk.serve.http.chat_template import ChatTemplate

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's legacy completions default
DEFAULT_CHAT_MAX_TOKENS = 256  # only where the context length is unknown (vLLM: the rest of the context)
MAX_STOP_STRINGS = 16
MAX_LOGPROBS = 20
MAX_CHOICES = 64  # choices of one request: prompts of a batch times n
MAX_TOKEN_ID_DIGITS = len(str(MAX_INT32))  # no logit_bias key is longer (int() of 5,000 digits raises)
# fields that change what the answer means: refused rather than silently ignored
UNSUPPORTED_FIELDS = ("functions", "function_call", "best_of", "suffix", "prompt_logprobs")
HARMLESS_VALUES: tuple[object, ...] = (None, [], {}, "", "none", {"type": "text"})  # defaults clients send explicitly

# the SamplingParams fields read from a body (as the body spells them, but max_tokens), in the order checked
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop_token_ids", "ignore_eos",
                   "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens", "logit_bias")
T = TypeVar("T")
Default = TypeVar("Default")


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
    more_prompts: tuple[list[int], ...] = ()  # a batched completions request: the prompts after the first
    n: int = 1  # samples per prompt
    tool_setup: ToolSetup | None = None  # chat with tools: how calls are asked for and parsed
    max_tokens_given: bool = True  # False: the client left it out (chat then gets the rest of the context)
    include_stop_str_in_output: bool = False  # vLLM's: the stop string that ended the text is sent too
    skip_special_tokens: bool = True  # vLLM's: False keeps special tokens in the text
    echo: bool = False  # completions: the prompt comes first in the text (and its logprobs, when asked)
    echo_only: bool = False  # echo with max_tokens 0: the prompt alone (one token is made and dropped)


# fields

def _typed(body: JsonObject, name: str, kinds: tuple[type[T], ...], default: T, what: str) -> T:
    value = body.get(name, default)
    if value is None:
        return default
    # bool is an int in Python; a JSON true is never a valid number here
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise BadRequestError(f"'{name}' must be {what}, got {show_value(value)}", param=name)
    return value


def _integer(body: JsonObject, name: str, low: int, high: int, default: Default, note: str = "") -> int | Default:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"'{name}' must be an integer in [{low}, {high}]{note}, got {show_value(value)}",
                              param=name)
    if not low <= value <= high:
        raise BadRequestError(f"'{name}' must be in [{low}, {high}]{note}, got {show_value(value)}", param=name)
    return value


def _number(body: JsonObject, name: str, default: float) -> float:
    value: float = _typed(body, name, (int, float), default, "a number")
    try:
        value = float(value)  # an integer past float's range raises
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise BadRequestError(f"'{name}' must be a finite number, got {show_value(body[name])}", param=name)
    return value


def _temperature(body: JsonObject) -> float:
    t = _number(body, "temperature", 1.0)
    if t != 0 and not t >= MIN_TEMPERATURE:
        # below MIN_TEMPERATURE, logits / t overflows float32 and the sampler would see inf/NaN
        raise BadRequestError(f"'temperature' must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {t!r}",
                              param="temperature")
    return t


def _top_p(body: JsonObject) -> float:
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise BadRequestError(f"'top_p' must be in (0, 1], got {top_p!r}", param="top_p")
    return top_p


def _stop_strings(body: JsonObject) -> tuple[str, ...]:
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


def _token_ids(value: object, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise BadRequestError(f"'{name}' must be a list of integer token ids", param=name)
    bad = next((t for t in value if not 0 <= t <= MAX_INT32), None)
    if bad is not None:  # the engine checks against the vocabulary; this keeps them int32 on the way
        raise BadRequestError(f"'{name}': token ids must be in [0, {MAX_INT32}], got {show_value(bad)}", param=name)
    return list(value)


def _completion_prompts(body: JsonObject, encode: Callable[[str], list[int]]) -> list[list[int]]:
    """The prompt, or each prompt of a batch (a list of strings or of token id lists)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [encode(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > MAX_CHOICES:
            raise BadRequestError(f"'prompt': at most {MAX_CHOICES} prompts in a batch", param="prompt")
        return [encode(p) if isinstance(p, str) else _token_ids(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    if isinstance(prompt, list):
        return [_token_ids(prompt, "prompt")]
    raise BadRequestError("'prompt' is required: a string, a list of token ids, or a list of either",
                          param="prompt")


def _logprobs(body: JsonObject, chat: bool) -> int | None:
    if chat:
        if not _typed(body, "logprobs", (bool,), False, "a boolean"):
            return None
        return _integer(body, "top_logprobs", 0, MAX_LOGPROBS, 0)
    return _integer(body, "logprobs", 0, MAX_LOGPROBS, None)


def _echo(body: JsonObject, chat: bool) -> bool:
    echo = _typed(body, "echo", (bool,), False, "a boolean")
    if echo and chat:
        raise BadRequestError("'echo' is supported on /v1/completions only", param="echo")
    return echo


def _refuse_unsupported(body: JsonObject) -> None:
    for name in UNSUPPORTED_FIELDS:
        # best_of = n asks for nothing more than n (vLLM V1 dropped best_of > n too)
        if body.get(name) not in HARMLESS_VALUES and not (name == "best_of" and body[name] in (1, body.get("n", 1))):
            raise BadRequestError(f"'{name}' is not supported by this server; leave it out", param=name)


def parse_request(body: object, chat: bool, encode: Callable[[str], list[int]],
                  check_structured: Callable[[StructuredOutput], None] | None = None,
                  chat_template: ChatTemplate | None = None) -> ParsedRequest:
    """Validate an OpenAI completions (``chat=False``) or chat completions body.

    Args:
        body: the decoded JSON body (`decode_body`).
        chat: chat completions (``messages``) rather than completions (``prompt``).
        encode: text -> prompt token ids of the served model (BOS included where it has one).
        check_structured: whether a structured-output constraint compiles for the served model
            (`structured_request.parse_structured`); None: such requests are refused.
        chat_template: the served checkpoint's template; None: the built-in one (`chat_request`).
    Returns:
        the parsed request.
    Raises:
        BadRequestError: naming the first bad field and what it accepts.
    """
    if not isinstance(body, dict):
        raise BadRequestError("the request body must be a JSON object")
    check_json_tree(body)
    _refuse_unsupported(body)
    echo = _echo(body, chat)
    tool_setup, more_prompts = None, []
    if chat:
        prompt_ids = encode(chat_prompt(body, chat_template))
        tool_setup = parse_tool_choice(body, check_tools(body), _special_token_id(encode))
        max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        default_max = DEFAULT_CHAT_MAX_TOKENS
    else:
        prompt_ids, *more_prompts = _completion_prompts(body, encode)
        max_name, default_max = "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS
    if not prompt_ids or not all(more_prompts):
        raise BadRequestError("the prompt is empty", param="messages" if chat else "prompt")
    n = _integer(body, "n", 1, MAX_CHOICES, 1)
    if n * (1 + len(more_prompts)) > MAX_CHOICES:
        raise BadRequestError(f"'n' times the prompts is at most {MAX_CHOICES}", param="n")
    top_k = _integer(body, "top_k", -1, MAX_INT32, 0, " (0 or -1 switch it off)")
    # read in `SAMPLING_FIELDS` order: the first bad one is the field a 400 names
    # max_tokens 0 asks for the echoed prompt alone: one token is made (decode must run) and dropped
    max_tokens = max(1, _integer(body, max_name, 0 if echo else 1, MAX_INT32, default_max,
                                 "" if echo else " (0 only with 'echo')"))
    temperature, top_p = _temperature(body), _top_p(body)
    top_k = 0 if top_k == -1 else top_k  # vLLM spells "off" as -1
    seed = _integer(body, "seed", 0, MAX_SEED, None)
    stop_token_ids = tuple(_token_ids(body.get("stop_token_ids") or [], "stop_token_ids"))
    ignore_eos = _typed(body, "ignore_eos", (bool,), False, "a boolean")
    presence_penalty = _number(body, "presence_penalty", 0.0)
    frequency_penalty = _number(body, "frequency_penalty", 0.0)
    repetition_penalty = _number(body, "repetition_penalty", 1.0)
    min_p = _number(body, "min_p", 0.0)
    min_tokens = _integer(body, "min_tokens", 0, MAX_INT32, 0)
    logit_bias = _logit_bias(body)
    logprobs = _logprobs(body, chat)
    structured = parse_structured(body, check_structured)
    forced = forced_calls(tool_setup) if tool_setup else None
    if forced is not None:
        if structured is not None:
            raise BadRequestError("'tool_choice' forces a tool call; it cannot be combined with 'response_format'",
                                  param="tool_choice")
        structured = forced
        try:
            if check_structured is not None:
                check_structured(structured)
        except StructuredOutputError as exc:  # a tool's parameters schema the grammar cannot take
            raise BadRequestError(f"'tools': {exc}", param="tools") from None
    try:  # SamplingParams checks again: what reaches a unit is valid however it was built
        params = SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
            stop_token_ids=stop_token_ids, ignore_eos=ignore_eos, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty, min_p=min_p,
            min_tokens=min_tokens, logit_bias=logit_bias, logprobs=logprobs, structured=structured,
            prompt_logprobs=logprobs if echo else None)
    except SamplingError as exc:
        bad = next((k for k in SAMPLING_FIELDS if f"{k}=" in str(exc)), None)
        raise BadRequestError(str(exc), param=max_name if bad == "max_tokens" else bad) from None
    options = _typed(body, "stream_options", (dict,), {}, "an object")
    stream = _typed(body, "stream", (bool,), False, "a boolean")
    include_usage = options.get("include_usage")
    if include_usage is not None and not isinstance(include_usage, bool):
        raise BadRequestError(f"'stream_options.include_usage' must be a boolean, got {show_value(include_usage)}",
                              param="stream_options.include_usage")
    return ParsedRequest(
        chat=chat, prompt_ids=prompt_ids, params=params, stop=_stop_strings(body), stream=stream,
        include_usage=bool(include_usage) and stream, logprobs=logprobs,
        return_token_ids=_typed(body, "return_token_ids", (bool,), False, "a boolean"), tool_setup=tool_setup,
        max_tokens_given=body.get(max_name) is not None, more_prompts=tuple(more_prompts), n=n,
        include_stop_str_in_output=_typed(body, "include_stop_str_in_output", (bool,), False, "a boolean"),
        skip_special_tokens=_typed(body, "skip_special_tokens", (bool,), True, "a boolean"),
        echo=echo, echo_only=echo and body.get(max_name) == 0,
    )


def _logit_bias(body: JsonObject) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` as ((token id, bias), ...), ids sorted. A key is a token id in
    ASCII decimal digits only: ``str.isdigit`` and ``int`` also take "²", "٣" or "１２" (read as 3 and
    12, or raising), and ``int`` takes " 7", "+7" and "7_0"; none of those names a token."""
    bias = _typed(body, "logit_bias", (dict,), {}, "an object of token id -> bias")
    out: dict[int, float] = {}
    keys: dict[int, str] = {}
    for key, value in bias.items():
        if not (key.isascii() and key.isdigit()) or len(key) > MAX_TOKEN_ID_DIGITS or int(key) > MAX_INT32:
            raise BadRequestError(f"'logit_bias': key {show_value(key)} is not a token id: write token ids in "
                                  f"ASCII decimal digits (0-9), at most {MAX_INT32}", param="logit_bias")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequestError(f"'logit_bias' maps token ids to numbers in [-100, 100], got {show_value(key)}: "
                                  f"{show_value(value)}", param="logit_bias")
        token = int(key)
        if token in keys:
            raise BadRequestError(f"'logit_bias': keys {show_value(keys[token])} and {show_value(key)} both name "
                                  f"token {token}; give each token once", param="logit_bias")
        keys[token], out[token] = key, float(value)
    return tuple(sorted(out.items()))


def _special_token_id(encode: Callable[[str], list[int]]) -> Callable[[str], int | None]:
    """text -> its token id when the tokenizer encodes it as one token (past a bos it adds), else None."""
    prefix = encode("")

    def token_id(text: str) -> int | None:
        ids = encode(text)
        ids = ids[len(prefix):] if ids[: len(prefix)] == prefix else ids
        return ids[0] if len(ids) == 1 else None

    return token_id


# the model's context

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
