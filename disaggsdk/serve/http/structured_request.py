"""The structured-output fields of an OpenAI request -> one `StructuredOutput`, with 400 errors
that name the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError
from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.openai_json import JsonObject, show_value

VLLM_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# vLLM's StructuredOutputsParams options; disable_fallback changes nothing here (there is no other
# backend to fall back to), disable_any_whitespace: true is the layout JSON always has here
VLLM_OPTIONS = ("whitespace_pattern", "disable_any_whitespace", "disable_fallback", "disable_additional_properties")
UNSUPPORTED_KINDS = ("structural_tag",)
GUIDED_KINDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
BACKENDS = ("auto", "guidance", "llguidance")  # vLLM calls llguidance "guidance"
JSON_KINDS = ("json", "json_object")
# where a request sets its own JSON whitespace, the separators are bare (llguidance's defaults) and
# the whitespace around them is what the request allows
BARE_SEPARATORS = {"item_separator": ",", "key_separator": ":"}


def _constraint(name: str, kind: str, value: object) -> StructuredOutput:
    """One constraint field's value (``name``: the field, as a 400 names it) as a `StructuredOutput`."""
    if kind == "json":
        if isinstance(value, str):  # vLLM takes the schema as text too
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise BadRequestError(f"'{name}' is not valid JSON: {exc}", param=name) from None
        if not isinstance(value, dict):
            hint = " (true and false are no schema here; json_object asks for any JSON object)" \
                if isinstance(value, bool) else ""
            raise BadRequestError(f"'{name}' must be a JSON Schema object, got {show_value(value)}{hint}", param=name)
        return StructuredOutput.json_schema(value)
    if kind == "json_object":
        if value is not True:
            raise BadRequestError(f"'{name}' must be true (leave it out to ask for no constraint), got "
                                  f"{show_value(value)}", param=name)
        return StructuredOutput("json_object")
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(o, str) for o in value):
            raise BadRequestError(f"'{name}' must be a non-empty list of strings, got {show_value(value)}", param=name)
        return StructuredOutput.choice(value)
    if not isinstance(value, str) or not value:
        raise BadRequestError(f"'{name}' must be a non-empty string, got {show_value(value)}", param=name)
    return StructuredOutput(kind, value)


def _response_format(value: object) -> StructuredOutput | None:
    if not isinstance(value, dict):
        raise BadRequestError(f"'response_format' must be an object with a 'type', got {show_value(value)}",
                              param="response_format")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind != "json_schema":
        raise BadRequestError(f"'response_format.type' must be text, json_object or json_schema, got "
                              f"{show_value(kind)}", param="response_format.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise BadRequestError("'response_format.json_schema.schema' is required: a JSON Schema object",
                              param="response_format.json_schema.schema")
    return StructuredOutput.json_schema(spec["schema"])


def _vllm_structured(value: object, layout: dict[str, object]) -> StructuredOutput | None:
    """``structured_outputs``' constraint (None: options only); its options go into ``layout``."""
    if not isinstance(value, dict):
        raise BadRequestError(f"'structured_outputs' must be an object, got {show_value(value)}",
                              param="structured_outputs")
    unknown = next((k for k in value if k not in VLLM_KINDS + VLLM_OPTIONS + UNSUPPORTED_KINDS), None)
    if unknown is not None:
        raise BadRequestError(f"'structured_outputs' has no field {show_value(unknown)}: it takes one of "
                              f"{', '.join(VLLM_KINDS)}, and the options {', '.join(VLLM_OPTIONS)}",
                              param=f"structured_outputs.{unknown}")
    unsupported = next((k for k in UNSUPPORTED_KINDS if value.get(k) is not None), None)
    if unsupported is not None:
        raise BadRequestError(f"'structured_outputs.{unsupported}' is not supported by this server; give one of "
                              f"{', '.join(VLLM_KINDS)}", param=f"structured_outputs.{unsupported}")
    given = [k for k in VLLM_KINDS if value.get(k) is not None]
    if len(given) > 1:
        raise BadRequestError(f"'structured_outputs' takes one of {', '.join(VLLM_KINDS)}; got {', '.join(given)}",
                              param="structured_outputs")
    for option in VLLM_OPTIONS:
        if value.get(option) is not None:
            layout[f"structured_outputs.{option}"] = _option(f"structured_outputs.{option}", option, value[option])
    return _constraint(f"structured_outputs.{given[0]}", given[0], value[given[0]]) if given else None


def _option(name: str, option: str, value: object) -> object:
    """A checked option value (``option``: its name in `VLLM_OPTIONS`)."""
    if option == "whitespace_pattern":
        if not isinstance(value, str) or not value:
            raise BadRequestError(f"'{name}' must be a non-empty regular expression, got {show_value(value)}",
                                  param=name)
        return value
    if not isinstance(value, bool):
        raise BadRequestError(f"'{name}' must be a boolean, got {show_value(value)}", param=name)
    if option == "disable_additional_properties" and value:
        raise BadRequestError(f"'{name}' is not supported by this server; write \"additionalProperties\": false "
                              "into the schema's objects instead", param=name)
    return value


def _guided(body: JsonObject, layout: dict[str, object]) -> tuple[str, StructuredOutput] | None:
    """vLLM's ``guided_*`` constraint, as (field, output); ``guided_whitespace_pattern`` goes into ``layout``."""
    backend = body.get("guided_decoding_backend")
    if backend is not None and backend not in BACKENDS:
        raise BadRequestError(f"'guided_decoding_backend': this server builds every constraint with llguidance; "
                              f"send one of {', '.join(BACKENDS)} or leave it out, got {show_value(backend)}",
                              param="guided_decoding_backend")
    if body.get("guided_whitespace_pattern") is not None:
        layout["guided_whitespace_pattern"] = _option("guided_whitespace_pattern", "whitespace_pattern",
                                                      body["guided_whitespace_pattern"])
    given = [name for name in GUIDED_KINDS if body.get(name) is not None]
    if len(given) > 1:
        raise BadRequestError(f"give one of {', '.join(GUIDED_KINDS)}; got {', '.join(given)}", param=given[1])
    if not given:
        return None
    return given[0], _constraint(given[0], GUIDED_KINDS[given[0]], body[given[0]])


def _laid_out(field: str, output: StructuredOutput, layout: dict[str, object]) -> StructuredOutput:
    """``output`` with the request's JSON whitespace options (``layout``: field -> value) applied as
    llguidance's ``x-guidance`` options of its schema (they win over the schema's own)."""
    pattern = next((v for k, v in layout.items() if k.endswith("whitespace_pattern")), None)
    any_whitespace = layout.get("structured_outputs.disable_any_whitespace") is False
    if pattern is None and not any_whitespace:
        return output  # the default layout (disable_any_whitespace: true), or options that change nothing
    if output.kind not in JSON_KINDS:
        name = next(k for k in layout if k.endswith("whitespace_pattern") or k.endswith("disable_any_whitespace"))
        raise BadRequestError(f"'{name}' applies to JSON constraints only; '{field}' asks for {output.kind}", param=name)
    options: dict[str, object] = dict(BARE_SEPARATORS)
    options |= {"whitespace_pattern": pattern} if pattern is not None else {"whitespace_flexible": True}
    schema = json.loads(output.value) if output.kind == "json" else {"type": "object"}
    own = schema.get("x-guidance", {})
    if not isinstance(own, dict):
        raise BadRequestError(f"'{field}': the schema's \"x-guidance\" must be an object", param=field)
    return StructuredOutput.json_schema(schema | {"x-guidance": own | options})


def parse_structured(body: JsonObject, check: Callable[[StructuredOutput], None] | None
                     ) -> StructuredOutput | None:
    """The request's constraint, or None when it asks for none.

    Args:
        body: the request body.
        check: raises `StructuredOutputError` when a constraint does not compile for the served
            model; None: this server cannot constrain output (a request that asks is a 400).
    Raises:
        BadRequestError: a malformed, empty or unknown field, several spellings at once, options
            without a constraint or that do not apply to it, or a constraint that does not compile
            (llguidance's reason, naming the field).
    """
    found: list[tuple[str, StructuredOutput]] = []
    layout: dict[str, object] = {}  # the options given, by field
    if body.get("response_format") not in (None, {}):
        output = _response_format(body["response_format"])
        if output is not None:
            found.append(("response_format", output))
    asked = body.get("structured_outputs") is not None
    if asked:
        output = _vllm_structured(body["structured_outputs"], layout)
        if output is not None:
            found.append(("structured_outputs", output))
    guided = _guided(body, layout)
    if guided is not None:
        found.append(guided)
    if len(found) > 1:
        names = [f for f, _ in found]
        raise BadRequestError(f"give one of 'response_format', 'structured_outputs' or the guided_* fields; got "
                              f"{', '.join(names)}", param=names[1])
    if not found:
        if asked or layout:
            name = "structured_outputs" if asked else next(iter(layout))
            raise BadRequestError(f"'{name}' asks for no constraint: give one of {', '.join(VLLM_KINDS)} (or "
                                  "response_format), or leave it out", param=name)
        return None
    field, output = found[0]
    output = _laid_out(field, output, layout)
    if check is None:
        raise BadRequestError(f"'{field}': this server cannot constrain output", param=field)
    try:
        check(output)
    except StructuredOutputError as exc:
        raise BadRequestError(f"'{field}': {exc}", param=field) from None
    return output
