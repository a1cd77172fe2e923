"""Tool calls in Qwen3-Coder's format: ``tool_choice``, the grammar that forces a call, and the
parser that turns the model's output into OpenAI ``tool_calls``.

The trained checkpoints' template (as Qwen3-Coder's) asks for calls as
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from disaggsdk.engine.structured.output import JSON_LAYOUT, StructuredOutput
from disaggsdk.serve.http.chat_request import Tool, check_tool_name
from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.openai_json import JsonObject, show_value

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
MAX_FORCED_CALLS = 4
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
# Lark terminals for scalar values: bounded, so a forced call always ends, and JSON's own literals
# (no leading zeros: "-0123" is no JSON number, and it came back as a string)
_VALUE = {"string": r"/[^<\n]{1,200}/", "integer": r"/-?(0|[1-9][0-9]{0,11})/",
          "number": r"/-?(0|[1-9][0-9]{0,11})(\.[0-9]{1,8})?/", "boolean": '"true" | "false"', "null": '"null"'}
# What `_convert` reads as a number in a call the model wrote freely (auto): Python's int() and
# float() would also take "1_000", " 7" and "nan"
_INTEGER_TEXT = re.compile(r"-?[0-9]+")
_NUMBER_TEXT = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")


@dataclass(frozen=True)
class ToolSetup:
    """A chat request's tools and what it asks of them."""

    tools: tuple[Tool, ...]
    choice: str  # "none" | "auto" | "required" | "function"
    function: str | None  # the named function, for choice "function"
    open_id: int  # token id of <tool_call>
    close_id: int  # token id of </tool_call>

    def schema(self, name: str) -> JsonObject:
        """The parameters schema of tool ``name`` ({} when unknown)."""
        return next((tool["function"].get("parameters") or {}
                     for tool in self.tools if tool["function"]["name"] == name), {})


def parse_tool_choice(body: JsonObject, tools: list[Tool] | None,
                      token_id: Callable[[str], int | None]) -> ToolSetup | None:
    """The request's `ToolSetup` (None without tools, or with ``tool_choice: none``).

    Args:
        body: the chat request.
        tools: its checked tools (`chat_request.check_tools`).
        token_id: text -> the id of a special token, or None when the tokenizer has no such token.
    Raises:
        BadRequestError: a malformed tool_choice, a named function that is no valid function name or
            not in tools, tool_choice without tools, or a model whose tokenizer has no tool-call tokens.
    """
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none"):
            raise BadRequestError("'tool_choice' needs 'tools'", param="tool_choice")
        return None
    function = None
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        fn = choice.get("function")
        function = fn.get("name") if isinstance(fn, dict) else None
        if choice.get("type") != "function" or not isinstance(function, str):
            raise BadRequestError("'tool_choice' must be none, auto, required or {type: function, function: {name}}",
                                  param="tool_choice")
        check_tool_name(function, "tool_choice.function.name")
        if function not in {t["function"]["name"] for t in tools}:
            raise BadRequestError(f"'tool_choice' names {function!r}, which is not in 'tools'", param="tool_choice")
        choice = "function"
    elif choice not in ("none", "auto", "required"):
        raise BadRequestError(f"'tool_choice' must be none, auto, required or a function, got {show_value(choice)}",
                              param="tool_choice")
    if choice == "none":
        return None
    open_id, close_id = token_id(CALL_OPEN), token_id(CALL_CLOSE)
    if open_id is None or close_id is None:
        raise BadRequestError(f"'tools': this model's tokenizer has no {CALL_OPEN} token to call tools with",
                              param="tools")
    return ToolSetup(tuple(tools), choice, function, open_id, close_id)


def _value_rule(schema: JsonObject) -> str:
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return " | ".join(json.dumps(v if isinstance(v, str) else json.dumps(v)) for v in enum)
    kind = schema.get("type")
    if isinstance(kind, str) and kind in _VALUE:
        return _VALUE[kind]
    # objects, arrays, unions: JSON of that schema, laid out as response_format's JSON is
    return "%json " + json.dumps({**(schema or {}), "x-guidance": JSON_LAYOUT})


def forced_calls(setup: ToolSetup) -> StructuredOutput | None:
    """The grammar for ``required`` and a named function (None for ``auto``)."""
    if setup.choice not in ("required", "function"):
        return None
    rules, calls = [], []
    for i, tool in enumerate(setup.tools):
        name = tool["function"]["name"]
        if setup.choice == "function" and name != setup.function:
            continue
        schema = tool["function"].get("parameters") or {}
        # a list of names and an object where present (`chat_request.check_tools`)
        required_names, properties = schema.get("required"), schema.get("properties")
        required = set(required_names) if isinstance(required_names, list) else set()
        params = []
        for j, (key, sub) in enumerate((properties if isinstance(properties, dict) else {}).items()):
            rules.append(f"p{i}_{j}: {json.dumps(f'<parameter={key}>' + chr(10))} v{i}_{j} "
                         f"{json.dumps(chr(10) + '</parameter>' + chr(10))}")
            rules.append(f"v{i}_{j}: {_value_rule(sub if isinstance(sub, dict) else {})}")
            params.append(f"p{i}_{j}" + ("" if key in required else "?"))
        body = " ".join(params)
        rules.append(f"c{i}: <[{setup.open_id}]> {json.dumps(chr(10) + f'<function={name}>' + chr(10))} {body} "
                     f"\"</function>\\n\" <[{setup.close_id}]>")
        calls.append(f"c{i}")
    call = " | ".join(calls)
    more = ' ("\\n" call)?' * (MAX_FORCED_CALLS - 1 if setup.choice == "required" else 0)
    return StructuredOutput("grammar", "\n".join([f"start: call{more}", f"call: {call}", *rules]))


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is no JSON value")  # Python's json reads NaN and Infinity; JSON has neither


def _convert(value: str, schema: JsonObject) -> object:
    """A parameter's text as the JSON value its schema declares; the text itself where it is not one.

    The call format writes every value as bare text, so the declared type decides (as vLLM's
    qwen3_coder parser does): a freely written "-0123" for an integer is -123, not a string.
    """
    kind = schema.get("type")
    enum = schema.get("enum")
    if isinstance(enum, list):  # the forced grammar writes a member as itself (strings) or its JSON
        for member in enum:
            if value == (member if isinstance(member, str) else json.dumps(member)):
                return member
    if kind == "string" or not schema:
        return value
    text = value.strip()
    try:  # int() and json refuse integers past 4,300 digits with a ValueError too
        if kind in ("integer", "number") and _INTEGER_TEXT.fullmatch(text):
            return int(text)
        if kind == "number" and _NUMBER_TEXT.fullmatch(text):
            number = float(text)
            return number if math.isfinite(number) else value  # "1e999": JSON has no infinity
        if kind == "boolean" and text.lower() in ("true", "false"):
            return text.lower() == "true"
        return json.loads(text, parse_constant=_no_constant)  # objects, arrays, unions, null
    except ValueError:
        return value


def parse_calls(text: str, setup: ToolSetup) -> list[JsonObject]:
    """OpenAI ``tool_calls`` of the text inside the model's ``<tool_call>`` blocks (specials removed)."""
    calls: list[JsonObject] = []
    for name, inner in _FUNCTION.findall(text):
        properties = setup.schema(name.strip()).get("properties")
        props = properties if isinstance(properties, dict) else {}  # an object where present (`check_tools`)
        arguments: JsonObject = {}
        for key, value in _PARAMETER.findall(inner):
            sub = props.get(key.strip())  # a schema may also be true or false (JSON Schema's any, none)
            arguments[key.strip()] = _convert(value, sub if isinstance(sub, dict) else {})
        calls.append({"id": f"chatcmpl-tool-{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name.strip(), "arguments": json.dumps(arguments)}})
    return calls
