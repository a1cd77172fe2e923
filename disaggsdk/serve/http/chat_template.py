"""A checkpoint's own chat template (``tokenizer_config.json``), rendered as transformers renders it."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError
from disaggsdk.serve.http.openai_json import JsonObject

if TYPE_CHECKING:
    from jinja2 import Template

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token", "additional_special_tokens")


class ChatTemplateError(DisaggError):
    """The template failed for these messages (its own raise_exception, or a Jinja error)."""


def _token_text(value: object) -> object:
    # tokenizer_config.json writes a special token as text or as {"content": text, ...}
    return value.get("content") if isinstance(value, dict) else value


@functools.lru_cache(maxsize=16)
def _compile(source: str) -> Template:
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    def tojson(x: object, ensure_ascii: bool = False, indent: int | str | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)


def _parsed_arguments(messages: list[JsonObject]) -> list[JsonObject]:
    out = copy.deepcopy(messages)
    for message in out:
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:  # a list where present (`check_messages`)
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass  # not JSON: the template gets the text as sent
    return out


class ChatTemplate:
    """One checkpoint's template and special tokens.

    Args:
        source: the Jinja text.
        special_tokens: ``bos_token`` etc. as the template sees them.
    """

    def __init__(self, source: str, special_tokens: JsonObject):
        self.source = source
        self.special_tokens = special_tokens

    @property
    def bos_token(self) -> str | None:
        """The text of the checkpoint's bos token (None without one)."""
        bos = self.special_tokens.get("bos_token")
        return bos if isinstance(bos, str) else None

    def render(self, messages: list[JsonObject], tools: Sequence[Mapping[str, object]] | None = None,
               add_generation_prompt: bool = True, kwargs: JsonObject | None = None) -> str:
        """The prompt text of ``messages`` (and ``tools``).

        Raises:
            ChatTemplateError: the template refused the messages or failed; the message says why.
        """
        from jinja2.exceptions import TemplateError

        context = {**self.special_tokens, **(kwargs or {}), "messages": _parsed_arguments(messages),
                   "tools": tools, "add_generation_prompt": add_generation_prompt}
        try:
            return _compile(self.source).render(**context)
        except TemplateError as exc:
            raise ChatTemplateError(f"the model's chat template failed: {exc}") from None


def load_chat_template(directory: Path | None) -> ChatTemplate | None:
    """The template in ``directory/tokenizer_config.json`` (its "default" one when it names several),
    or None when there is none."""
    path = directory / "tokenizer_config.json" if directory else None
    if path is None or not path.is_file():
        return None
    config = json.loads(path.read_text())
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source:
        return None
    return ChatTemplate(source, {k: _token_text(config.get(k)) for k in SPECIAL_TOKEN_KEYS})


def model_chat_template(model: str) -> ChatTemplate | None:
    """The chat template of a catalog name (its shipped checkpoint) or checkpoint directory."""
    from disaggsdk.models.shipped import checkpoint_directory

    return load_chat_template(checkpoint_directory(model))
