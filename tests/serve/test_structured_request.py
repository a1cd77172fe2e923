"""Structured output is never dropped in silence (issue 55 finding 5): vLLM's ``guided_*`` fields are
honoured as vLLM honours them, a constraint value that asks for nothing (``json: false``) and a
constraint no output can match (``{"$ref": "#"}``, a pattern no string matches) are 400s, and a
random mix of such fields gives either an answer that meets its constraint or a 400, never 500 and
never free text."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("llguidance")

from disaggsdk.engine.structured.grammar import check_structured
from disaggsdk.engine.structured.output import StructuredOutput
from disaggsdk.serve.http.error_bodies import BadRequestError
from disaggsdk.serve.http.structured_request import parse_structured

MODEL = "qwen3-coder-tiny"  # the served model of tests/serve/conftest.py


def check(output: StructuredOutput) -> None:
    check_structured(MODEL, output)


def parsed(body: dict) -> StructuredOutput | None:
    return parse_structured(body, check)


def refused(body: dict) -> BadRequestError:
    with pytest.raises(BadRequestError) as error:
        parsed(body)
    assert error.value.status == 400
    return error.value


# vLLM's guided_* fields

@pytest.mark.parametrize("field, value, expected", [
    ("guided_regex", "[a-c]{2}", StructuredOutput("regex", "[a-c]{2}")),
    ("guided_choice", ["yes", "no"], StructuredOutput.choice(["yes", "no"])),
    ("guided_grammar", 'start: "x"', StructuredOutput("grammar", 'start: "x"')),
    ("guided_json", {"type": "integer"}, StructuredOutput.json_schema({"type": "integer"})),
    ("guided_json", '{"type": "integer"}', StructuredOutput.json_schema({"type": "integer"})),  # text too, as vLLM
])
def test_vllms_guided_fields_are_the_constraints_structured_outputs_names(field, value, expected):
    assert parsed({field: value}) == expected
    assert parsed({field: value, "guided_decoding_backend": "guidance"}) == expected


def test_guided_whitespace_pattern_sets_the_json_whitespace_and_applies_to_json_only():
    output = parsed({"guided_json": {"type": "object"}, "guided_whitespace_pattern": "[ ]?"})
    assert json.loads(output.value)["x-guidance"] == {"item_separator": ",", "key_separator": ":",
                                                       "whitespace_pattern": "[ ]?"}
    assert refused({"guided_regex": "a", "guided_whitespace_pattern": " "}).param == "guided_whitespace_pattern"
    assert refused({"guided_whitespace_pattern": " "}).param == "guided_whitespace_pattern"  # with no constraint


def test_structured_outputs_options_apply_to_the_constraint_given():
    flexible = parsed({"structured_outputs": {"json_object": True, "disable_any_whitespace": False}})
    assert json.loads(flexible.value) == {"type": "object", "x-guidance": {"item_separator": ",", "key_separator": ":",
                                                                           "whitespace_flexible": True}}
    schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}
    # options alone beside response_format (a client's habit vLLM refuses): the default layout, honoured
    assert parsed({"response_format": schema, "structured_outputs": {"disable_any_whitespace": True,
                                                                     "disable_fallback": True}}) \
        == StructuredOutput.json_schema({"type": "integer"})
    assert refused({"structured_outputs": {"json": {}, "disable_additional_properties": True}}).param \
        == "structured_outputs.disable_additional_properties"


@pytest.mark.parametrize("body, param", [
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"guided_regex": "a", "structured_outputs": {"regex": "b"}}, "guided_regex"),
    ({"guided_json": {}, "response_format": {"type": "json_object"}}, "guided_json"),
    ({"guided_regex": "a", "guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
    ({"guided_regex": ""}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": False}, "guided_json"),
    ({"guided_grammar": 3}, "guided_grammar"),
])
def test_guided_fields_that_conflict_or_ask_for_nothing_are_400s(body, param):
    assert refused(body).param == param


# values that ask for nothing, and keys this server does not take

@pytest.mark.parametrize("value, param", [
    ({"json": False}, "structured_outputs.json"),
    ({"json": True}, "structured_outputs.json"),
    ({"json": "false"}, "structured_outputs.json"),
    ({"json": ""}, "structured_outputs.json"),
    ({"json_object": False}, "structured_outputs.json_object"),
    ({"json_object": 1}, "structured_outputs.json_object"),
    ({"regex": ""}, "structured_outputs.regex"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"grammar": ""}, "structured_outputs.grammar"),
    ({}, "structured_outputs"),
    ({"disable_any_whitespace": True}, "structured_outputs"),
    ({"structural_tag": "{}"}, "structured_outputs.structural_tag"),
    ({"regexp": "a"}, "structured_outputs.regexp"),
])
def test_structured_outputs_that_ask_for_nothing_or_unknown_fields_are_400s(value, param):
    assert refused({"structured_outputs": value}).param == param


def test_a_boolean_json_schema_in_response_format_is_a_400():
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": False}}}
    assert refused(body).param == "response_format.json_schema.schema"


# constraints no output can match

@pytest.mark.parametrize("body", [
    {"structured_outputs": {"json": {"$ref": "#"}}},
    {"guided_json": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"$ref": "#"}}}},
    {"guided_regex": r"[^\s\S]"},
    {"structured_outputs": {"regex": "[a&&b]"}},
], ids=["self-ref", "ref-cycle", "response_format self-ref", "empty class", "empty intersection"])
def test_a_constraint_no_output_can_match_is_a_400_at_admission(body):
    assert "no output can match it" in str(refused(body))


# over HTTP: honoured, or refused

def complete(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"prompt": "answer: ", "max_tokens": 16, "temperature": 0} | body,
                      timeout=60)


def test_guided_fields_constrain_what_the_server_answers(deployment):
    r = complete(deployment.url, {"guided_regex": "[a-c]{3}_[0-9]"})
    assert r.status_code == 200 and re.fullmatch("[a-c]{3}_[0-9]", r.json()["choices"][0]["text"]), r.text
    r = complete(deployment.url, {"guided_choice": ["alpha", "beta"]})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("alpha", "beta"), r.text
    r = complete(deployment.url, {"guided_json": {"type": "integer", "minimum": 0, "maximum": 9}})
    assert r.status_code == 200 and json.loads(r.json()["choices"][0]["text"]) in range(10), r.text
    r = httpx.post(f"{deployment.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "pick"}], "max_tokens": 16, "guided_grammar": 'start: "up" | "down"'})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("up", "down"), r.text


@pytest.mark.parametrize("body", [{"structured_outputs": {"json": False}}, {"structured_outputs": {"json": {"$ref": "#"}}},
                                  {"guided_regex": r"[^\s\S]"}])
def test_the_probes_requests_are_400_error_objects(deployment, body):
    r = complete(deployment.url, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


# the class, run again: random constraint fields, each honoured or refused

WORD = st.text(alphabet="abcxyz", min_size=1, max_size=4)
REGEX = st.builds(lambda cls, low, extra: (f"[{cls}]{{{low},{low + extra}}}"),
                  st.sampled_from(["a-c", "xyz", "0-9"]), st.integers(1, 3), st.integers(0, 2))
SCHEMA = (st.builds(lambda low, span: {"type": "integer", "minimum": low, "maximum": low + span},
                    st.integers(0, 50), st.integers(0, 20))
          | st.lists(WORD, min_size=1, max_size=3, unique=True).map(lambda words: {"enum": words})
          | st.just({"type": "boolean"}))
GRAMMAR = st.lists(WORD, min_size=1, max_size=3, unique=True)


def meets(kind: str, value: object, text: str) -> bool:
    """Whether an answer's ``text`` meets the constraint (kind, value) the server had to honour."""
    if kind == "regex":
        return re.fullmatch(str(value), text) is not None
    if kind == "choice":
        return text in value
    if kind == "grammar":  # a Lark grammar of `start: "w1" | "w2" ...`
        return text in re.findall(r'"([^"]*)"', str(value))
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), json.loads(value) if isinstance(value, str) else value)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


HONOURED = st.one_of(
    st.tuples(st.just("regex"), REGEX), st.tuples(st.just("choice"), st.lists(WORD, min_size=1, max_size=4)),
    st.tuples(st.just("grammar"), GRAMMAR.map(lambda words: "start: " + " | ".join(json.dumps(w) for w in words))),
    st.tuples(st.just("json"), SCHEMA), st.tuples(st.just("json"), SCHEMA.map(json.dumps)))
ASKS_FOR_NOTHING = st.one_of(
    st.tuples(st.just("json"), st.sampled_from([False, True, "false", "", "not json", 0, [], "[]"])),
    st.tuples(st.just("json_object"), st.sampled_from([False, 0, "true", "", []])),
    st.tuples(st.sampled_from(["regex", "grammar"]), st.sampled_from(["", 0, [], False, {}])),
    st.tuples(st.just("choice"), st.sampled_from([[], [1], "abc", {}, False, [None]])),
    st.tuples(st.just("regex"), st.sampled_from([r"[^\s\S]", "[a&&b]"])),  # no string matches
    st.tuples(st.just("json"), st.sampled_from([{"$ref": "#"}, {"type": "string", "minLength": 3, "maxLength": 1}])),
    st.tuples(st.sampled_from(["regexp", "structural_tag", "jsonschema"]), st.just("a")))


def spelled(kind: str, value: object, guided: bool) -> dict:
    """The request fields asking for (kind, value): vLLM's guided_* field where it has one, else structured_outputs."""
    if guided and kind in ("json", "regex", "choice", "grammar"):
        return {f"guided_{kind}": value}
    return {"structured_outputs": {kind: value}}


def test_random_constraint_fields_are_honoured_or_refused_never_free_text(deployment):
    statuses: list[int] = []
    with httpx.Client(base_url=deployment.url, timeout=60) as client:

        @settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(st.one_of(st.tuples(st.just(True), HONOURED), st.tuples(st.just(False), ASKS_FOR_NOTHING)),
               st.booleans(), st.booleans())
        def fuzz(case, guided, twice):
            honoured, (kind, value) = case
            body = spelled(kind, value, guided)
            if twice:  # a second constraint in another spelling: one spelling per request
                body |= {"guided_choice": ["a"]} if "structured_outputs" in body else {"structured_outputs": {"regex": "a"}}
            r = client.post("/v1/completions", json={"prompt": "answer: ", "max_tokens": 24, "temperature": 0} | body)
            statuses.append(r.status_code)
            if honoured and not twice:
                assert r.status_code == 200, (body, r.text)
                choice = r.json()["choices"][0]
                assert choice["finish_reason"] == "stop" and meets(kind, value, choice["text"]), (body, choice)
            else:
                assert r.status_code == 400, (body, r.status_code, r.text)
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error" and error["param"], error

        fuzz()
    assert statuses.count(200) >= 10 and statuses.count(400) >= 10
