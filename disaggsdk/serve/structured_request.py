"""The structured-output fields of an OpenAI request -> one `StructuredOutput`, with 400 errors
that name the field.

Two spellings are understood: OpenAI's ``response_format`` (``{type: json_object}``,
``{type: json_schema, json_schema: {name, schema, strict}}``; ``{type: text}`` is the default) and
vLLM's ``structured_outputs`` extra field (exactly one of ``json``, ``regex``, ``choice``,
``grammar``, ``json_object``). ``strict`` changes nothing: the schema is always enforced.
Whether the constraint compiles for the served model is checked by the caller's ``check``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from disaggsdk.engine.structured.output import StructuredOutput, StructuredOutputError
from disaggsdk.serve.error_bodies import BadRequestError
from disaggsdk.serve.openai_json import JsonObject, show_value

VLLM_KINDS = ("json", "regex", "choice", "grammar", "json_object")


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
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), (dict, bool)):
        raise BadRequestError("'response_format.json_schema.schema' is required: a JSON Schema object",
                              param="response_format.json_schema.schema")
    return StructuredOutput.json_schema(spec["schema"])


def _vllm_structured(value: object) -> StructuredOutput | None:
    if not isinstance(value, dict):
        raise BadRequestError(f"'structured_outputs' must be an object, got {show_value(value)}",
                              param="structured_outputs")
    given = [k for k in VLLM_KINDS if value.get(k) not in (None, False)]
    if len(given) > 1:
        raise BadRequestError(f"'structured_outputs' takes one of {', '.join(VLLM_KINDS)}; got {', '.join(given)}",
                              param="structured_outputs")
    if not given:
        return None
    kind, v = given[0], value[given[0]]
    name = f"structured_outputs.{kind}"
    if kind == "json":
        if isinstance(v, str):  # vLLM takes the schema as text too
            try:
                v = json.loads(v)
            except ValueError as exc:
                raise BadRequestError(f"'{name}' is not valid JSON: {exc}", param=name) from None
        if not isinstance(v, (dict, bool)):
            raise BadRequestError(f"'{name}' must be a JSON Schema object", param=name)
        return StructuredOutput.json_schema(v)
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "choice":
        if not isinstance(v, list) or not v or not all(isinstance(o, str) for o in v):
            raise BadRequestError(f"'{name}' must be a non-empty list of strings", param=name)
        return StructuredOutput.choice(v)
    if not isinstance(v, str) or not v:
        raise BadRequestError(f"'{name}' must be a non-empty string", param=name)
    return StructuredOutput(kind, v)


def parse_structured(body: JsonObject, check: Callable[[StructuredOutput], None] | None
                     ) -> StructuredOutput | None:
    """The request's constraint, or None when it asks for none.

    Args:
        body: the request body.
        check: raises `StructuredOutputError` when a constraint does not compile for the served
            model; None: this server cannot constrain output (a request that asks is a 400).
    Raises:
        BadRequestError: a malformed field, both spellings at once, or a constraint that does not
            compile (llguidance's reason, naming the field).
    """
    found = []
    if body.get("response_format") not in (None, {}):
        output = _response_format(body["response_format"])
        if output is not None:
            found.append(("response_format", output))
    if body.get("structured_outputs") not in (None, {}):
        output = _vllm_structured(body["structured_outputs"])
        if output is not None:
            found.append(("structured_outputs", output))
    if not found:
        return None
    if len(found) > 1:
        raise BadRequestError("give either 'response_format' or 'structured_outputs', not both",
                              param="structured_outputs")
    field, output = found[0]
    if check is None:
        raise BadRequestError(f"'{field}': this server cannot constrain output", param=field)
    try:
        check(output)
    except StructuredOutputError as exc:
        raise BadRequestError(f"'{field}': {exc}", param=field) from None
    return output
