"""The chat part of a request: messages and tools checked (400s naming the field), then the prompt
text, from the checkpoint's own template (`chat_template`) or the built-in one for models without."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Required, TypedDict, cast

from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.openai_json import JsonObject, show_value

if TYPE_CHECKING:
    from disaggsdk.serve.http.chat_template import ChatTemplate

ROLES = ("system", "user", "assistant", "developer", "tool")
# OpenAI's rule for function names. It also keeps a name from carrying the call format's own markup
# (``</function>``, ``<tool_call>``), which a forced call's grammar could not write back.
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
TOOL_NAME_RULE = "^[a-zA-Z0-9_-]{1,64}$"
# A parameter is written ``<parameter=KEY>``: a key with these cannot be written or parsed back
PARAMETER_KEY_FORBIDDEN = ("<", ">", "\n")


class ToolFunction(TypedDict, total=False):
    """A checked tool's ``function``: its name, and its parameters schema (an object) when given."""

    name: Required[str]
    parameters: JsonObject


class Tool(TypedDict):
    """One checked entry of a chat request's ``tools`` (`check_tools`); keys beside these reach
    the template as the client sent them."""

    function: ToolFunction


def check_tool_name(name: str, where: str) -> None:
    """Refuse a function name OpenAI would refuse.

    Args:
        name: the function name.
        where: the field it came from, for the message and ``param``.
    Raises:
        BadRequestError: the name does not match `TOOL_NAME_RULE`.
    """
    if not TOOL_NAME.fullmatch(name):
        raise BadRequestError(f"{where} {show_value(name)} is not a valid function name: it must match "
                              f"{TOOL_NAME_RULE} (letters, digits, _ and -, at most 64)", param=where)


def _check_parameters(parameters: JsonObject, where: str) -> None:
    required = parameters.get("required", [])
    if not isinstance(required, list) or not all(isinstance(key, str) for key in required):
        raise BadRequestError(f"{where}.required must be a list of parameter names, got {show_value(required)}",
                              param=f"{where}.required")
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        raise BadRequestError(f"{where}.properties must be an object of JSON Schemas, got {show_value(properties)}",
                              param=f"{where}.properties")
    for key in properties:
        if not isinstance(key, str) or not key or any(c in key for c in PARAMETER_KEY_FORBIDDEN):
            raise BadRequestError(f"{where}.properties has the key {show_value(key)}: a tool parameter's name "
                                  "must be non-empty, without '<', '>' or a newline (calls are written "
                                  "<parameter=NAME>)", param=f"{where}.properties")


def _text(content: object, where: str, optional: bool) -> str | None:
    if content is None and optional:
        return None
    if isinstance(content, list):  # content parts: only text is understood
        texts = [text for p in content if isinstance(p, dict) and p.get("type") == "text"
                 and isinstance(text := p.get("text"), str)]
        if len(texts) != len(content):
            raise BadRequestError(f"{where}: only text parts are supported", param=where)
        return "".join(texts)
    if not isinstance(content, str):
        raise BadRequestError(f"{where} must be a string", param=where)
    return content


def _tool_calls(calls: object, where: str) -> list[JsonObject]:
    if not isinstance(calls, list):
        raise BadRequestError(f"{where} must be a list", param=where)
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                fn.get("arguments", "{}"), (str, dict)):
            raise BadRequestError(f"{where}[{j}] must be {{type: function, function: {{name, arguments}}}}",
                                  param=f"{where}[{j}]")
    return calls


def check_messages(messages: object) -> list[JsonObject]:
    """The messages with text content (parts joined), or a 400 naming the bad one.

    Raises:
        BadRequestError: not a non-empty list of {role, content}; an unknown role; non-text content.
    """
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("'messages' must be a non-empty list of {role, content}", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise BadRequestError(f"messages[{i}].role must be system, user, assistant, developer or tool",
                                  param=f"messages[{i}].role")
        calls = msg.get("tool_calls")
        checked = {**msg, "content": _text(msg.get("content"), f"messages[{i}].content",
                                           optional=msg["role"] == "assistant" and bool(calls))}
        if calls is not None:
            checked["tool_calls"] = _tool_calls(calls, f"messages[{i}].tool_calls")
        out.append(checked)
    return out


def check_tools(body: JsonObject) -> list[Tool] | None:
    """``tools`` as the template sees them (None when absent).

    Raises:
        BadRequestError: not a list of {type: function, function: {name, parameters}}; a function name
            OpenAI refuses (`TOOL_NAME_RULE`); parameters whose properties are no object, whose
            required is no list of names, or with a name the call format cannot carry.
    """
    tools = body.get("tools")
    if tools in (None, []):
        return None
    if not isinstance(tools, list):
        raise BadRequestError(f"'tools' must be a list, got {show_value(tools)}", param="tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if (not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict)
                or not isinstance(fn.get("name"), str)
                or not isinstance(fn.get("parameters", {}), dict)):
            raise BadRequestError(f"tools[{i}] must be {{type: function, function: {{name, parameters}}}}",
                                  param=f"tools[{i}]")
        check_tool_name(fn["name"], f"tools[{i}].function.name")
        _check_parameters(fn.get("parameters") or {}, f"tools[{i}].function.parameters")
    return cast("list[Tool]", tools)  # each entry checked above


def render_builtin(messages: Sequence[JsonObject]) -> str:
    """The simple chat template used for models without one: ``<|role|>\\ncontent\\n`` per message,
    then ``<|assistant|>\\n`` for the reply."""
    return "".join(f"<|{m['role']}|>\n{m['content'] or ''}\n" for m in messages) + "<|assistant|>\n"


def chat_prompt(body: JsonObject, template: ChatTemplate | None) -> str:
    """The prompt text of a chat request.

    Raises:
        BadRequestError: bad messages, tools or chat_template_kwargs; tools for a model without a
            template; the template refusing the conversation.
    """
    from disaggsdk.serve.http.chat_template import ChatTemplateError

    messages = check_messages(body.get("messages"))
    tools = check_tools(body)
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequestError("'chat_template_kwargs' must be an object", param="chat_template_kwargs")
    add_generation_prompt = body.get("add_generation_prompt", True)
    if not isinstance(add_generation_prompt, bool):
        raise BadRequestError("'add_generation_prompt' must be a boolean", param="add_generation_prompt")
    if template is None:
        if tools:
            raise BadRequestError("'tools': this model has no chat template to present tools with",
                                  param="tools")
        return render_builtin(messages)
    try:
        text = template.render(messages, tools, add_generation_prompt, kwargs)
    except ChatTemplateError as exc:
        raise BadRequestError(str(exc), param="messages") from None
    # the server's encode adds the model's bos itself; a template that writes it would double it
    bos = template.bos_token
    return text[len(bos):] if bos and text.startswith(bos) else text
