"""The JSON document of an OpenAI request body, before any field is read.

What no field may hold is refused here, wherever in the tree it sits, so the field checks of
`openai_request` only ever see finite numbers, valid Unicode and a shallow tree.
"""

from __future__ import annotations

import json
import math
import re

from disaggsdk.serve.http.error_bodies import BadRequestError

# A JSON object, decoded from a request or built for an answer. Its values are `object`: a request's
# are checked (isinstance) where a field is read; an answer's are only ever serialized.
JsonObject = dict[str, object]

MAX_JSON_DEPTH = 64  # a chat body nests 4 levels; deeper is an attack on the parser, not a request
MAX_INT_DIGITS = 100  # the widest field (seed, int64) has 19 digits; longer literals are refused unparsed
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads pairs valid ones, so any left is lone


def _parse_int(literal: str) -> int:
    if len(literal) > MAX_INT_DIGITS:
        raise BadRequestError(f"the body holds an integer of {len(literal)} digits; no field takes more than 19")
    return int(literal)


def decode_body(raw: bytes) -> object:
    """The JSON value of a request body (UTF-8). NaN, Infinity and 1e400 decode to floats here;
    `check_json_tree` (run by `openai_request.parse_request`) refuses them, naming the field.

    Raises:
        BadRequestError: not UTF-8, not JSON, nested too deeply, or an absurdly long integer.
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequestError(f"the request body is not valid UTF-8 (byte {exc.start}); send UTF-8 JSON") from None
    try:
        return json.loads(text, parse_int=_parse_int)
    except RecursionError:  # the C scanner counts its depth; far past MAX_JSON_DEPTH anyway
        raise BadRequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:
        raise BadRequestError(f"the request body is not valid JSON: {exc}") from None


def _path(keys: tuple[object, ...]) -> str | None:
    out = ""
    for key in keys:
        out += f"[{key}]" if isinstance(key, int) else f".{key}" if out else str(key)
    return out or None


def show_value(value: object) -> str:
    """``value`` for a message: short, and never a 4,000-digit integer."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        if value.bit_length() > 10_000:  # str() of it would raise past 4,300 digits
            return f"a {value.bit_length()}-bit integer"
        digits = str(value)
        return f"{digits[:8]}...{digits[-4:]} ({len(digits.lstrip('-'))} digits)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_json_tree(body: object) -> None:
    """Refuse what no field may hold, wherever it is: nesting past `MAX_JSON_DEPTH`, a lone UTF-16
    surrogate in a string or key (tokenizers and UTF-8 encoders raise on it), a NaN or infinite number.

    Raises:
        BadRequestError: naming the path of the first bad value (``messages[0].content``).
    """
    stack: list[tuple[object, tuple[object, ...]]] = [(body, ())]
    while stack:
        value, keys = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and _LONE_SURROGATE.search(value):
                raise BadRequestError(f"'{_path(keys)}' holds a lone UTF-16 surrogate; send valid Unicode text",
                                      param=_path(keys))
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise BadRequestError(f"'{_path(keys)}' must be a finite number, got {value}", param=_path(keys))
        elif isinstance(value, (list, dict)):
            if len(keys) >= MAX_JSON_DEPTH:
                raise BadRequestError(f"the request body nests deeper than {MAX_JSON_DEPTH} levels",
                                      param=_path(keys[:1]))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and not key.isascii() and _LONE_SURROGATE.search(key):
                    raise BadRequestError("a key holds a lone UTF-16 surrogate; send valid Unicode text",
                                          param=_path(keys))
                if isinstance(item, (str, float, list, dict)):
                    stack.append((item, (*keys, key)))
