"""What a request's output must match: plain values, no llguidance, so they travel in `SamplingParams`.

The kinds are vLLM's ``structured_outputs`` fields: ``json`` (a JSON Schema), ``json_object``
(any JSON object: OpenAI's ``response_format: {type: json_object}``), ``regex``, ``choice`` (one of
a list of strings) and ``grammar`` (a Lark grammar, llguidance's dialect).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # declared in the stub only

KINDS = ("json", "json_object", "regex", "choice", "grammar")
# JSON without free whitespace between tokens, Python's json.dumps separators: llguidance's default
# allows any run of whitespace there, and a model can then emit newlines until max_tokens (vLLM's
# `disable_any_whitespace` exists for this). A schema's own "x-guidance" options still win.
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class StructuredOutputError(DisaggError):
    """A structured-output request that cannot be compiled: the message names the field and the problem."""


@dataclass(frozen=True)
class StructuredOutput:
    """One constraint on a request's output.

    Args:
        kind: one of `KINDS`.
        value: the schema as JSON text (``json``), the pattern (``regex``), the options as a JSON
            list of strings (``choice``), the Lark text (``grammar``); empty for ``json_object``.
    """

    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise StructuredOutputError(f"structured output kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if not isinstance(self.value, str):
            raise StructuredOutputError(f"structured output {self.kind}: the value must be text, got "
                                        f"{type(self.value).__name__}")

    @classmethod
    def json_schema(cls, schema: dict | bool) -> StructuredOutput:
        """A JSON Schema constraint (``schema`` as parsed JSON)."""
        return cls("json", json.dumps(schema))

    @classmethod
    def choice(cls, options: list[str]) -> StructuredOutput:
        """Exactly one of ``options``.

        Raises:
            StructuredOutputError: not a non-empty list of strings.
        """
        if not isinstance(options, list) or not options or not all(isinstance(o, str) for o in options):
            raise StructuredOutputError("structured output choice: give a non-empty list of strings")
        return cls("choice", json.dumps(options))

    def lark(self) -> str:
        """The constraint as llguidance grammar text (what `grammar.build_matcher` compiles).

        Raises:
            StructuredOutputError: a schema or choice list that is not valid JSON.
        """
        from llguidance import LLMatcher

        if self.kind in ("json", "json_object"):
            schema = self.value if self.kind == "json" else json.dumps({"type": "object"})
            try:
                json.loads(schema)
                return LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
            except (ValueError, TypeError, RuntimeError) as exc:  # llguidance's refusals of the text
                raise StructuredOutputError(f"structured output json: the schema cannot be used: {exc}") from None
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.value)
        if self.kind == "choice":
            try:
                options = json.loads(self.value)
            except ValueError as exc:
                raise StructuredOutputError(f"structured output choice: not a JSON list: {exc}") from None
            # JSON string literals are Lark string literals too (same escapes). One terminal, not one
            # rule of alternatives: the lexer matches the options as one automaton, where a rule of
            # more than 2,000 of them fails at the first token (llguidance's max_items_in_row) and
            # one of 70,000 cannot even be built; 70,000 options build in 0.6 s this way
            return LLMatcher.grammar_from_lark("start: CHOICE\nCHOICE: " + " | ".join(json.dumps(o) for o in options))
        return LLMatcher.grammar_from_lark(self.value)
