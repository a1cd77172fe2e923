"""Tool calls in Qwen3-Coder's format: tool_choice is checked, required and named choices are forced
by a grammar to valid calls, auto output is parsed, and the round trip (call, tool result, answer)
works with the openai client, streaming and not."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("llguidance")
openai = pytest.importorskip("openai")

from disaggsdk.engine.structured.grammar import GrammarState, ll_tokenizer  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402
from disaggsdk.serve.http.chat_request import check_tools  # noqa: E402
from disaggsdk.serve.http.error_bodies import BadRequestError  # noqa: E402
from disaggsdk.serve.http.tool_calls import ToolSetup, forced_calls, parse_calls, parse_tool_choice  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}, "units": {"enum": ["C", "F"]},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}},
        "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
TOOLS = [WEATHER, TIME]


def setup(choice="required", function=None) -> ToolSetup:
    tok = load_tokenizer("qwen3-coder-tiny")
    return ToolSetup(tuple(TOOLS), choice, function, tok.encode("<tool_call>")[0], tok.encode("</tool_call>")[0])


def test_tool_choice_is_checked():
    ids = {"<tool_call>": 3, "</tool_call>": 4}.get
    assert parse_tool_choice({}, TOOLS, ids).choice == "auto"
    assert parse_tool_choice({"tool_choice": "none"}, TOOLS, ids) is None
    named = parse_tool_choice({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, TOOLS, ids)
    assert named.choice == "function" and named.function == "get_time"
    for body, match in [({"tool_choice": "always"}, "must be none, auto, required"),
                        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not in 'tools'")]:
        with pytest.raises(BadRequestError, match=match):
            parse_tool_choice(body, TOOLS, ids)
    with pytest.raises(BadRequestError, match="needs 'tools'"):
        parse_tool_choice({"tool_choice": "required"}, None, ids)
    with pytest.raises(BadRequestError, match="no <tool_call> token"):
        parse_tool_choice({}, TOOLS, lambda _text: None)


def test_the_forced_grammar_takes_what_the_template_renders_and_parses_back():
    tok = load_tokenizer("qwen3-coder-tiny")
    s = setup()
    call = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n<parameter=where>\n{\"lat\": 59.9}\n</parameter>\n</function>\n</tool_call>")
    grammar = GrammarState(forced_calls(s), ll_tokenizer("qwen3-coder-tiny"))
    assert all(grammar.accept(t) for t in tok.encode(call))
    missing = GrammarState(forced_calls(s), ll_tokenizer("qwen3-coder-tiny"))  # days is required
    assert not all(missing.accept(t) for t in tok.encode(call.replace("<parameter=days>\n3\n</parameter>\n", "")))
    (parsed,) = parse_calls(tok.decode(tok.encode(call)), s)
    assert parsed["function"]["name"] == "get_weather" and parsed["id"].startswith("chatcmpl-tool-")
    assert json.loads(parsed["function"]["arguments"]) == {"city": "Oslo", "days": 3, "where": {"lat": 59.9}}
    named = forced_calls(setup("function", "get_time")).value
    assert "get_time" in named and "get_weather" not in named
    assert forced_calls(setup("auto")) is None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_round_trip_with_the_openai_client(deployment, stream):
    client = openai.OpenAI(base_url=f"{deployment.url}/v1", api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "What is the weather in Oslo for 3 days?"}]

    def ask(**kw):
        r = client.chat.completions.create(model=deployment.model_name, messages=messages, tools=TOOLS,
                                           max_tokens=120, temperature=0, stream=stream, **kw)
        if not stream:
            return r.choices[0].message.content, r.choices[0].message.tool_calls, r.choices[0].finish_reason
        content, calls, reason = "", [], None
        for chunk in r:
            delta = chunk.choices[0].delta if chunk.choices else None
            content += (delta.content or "") if delta else ""
            calls += (delta.tool_calls or []) if delta else []
            reason = chunk.choices[0].finish_reason if chunk.choices and chunk.choices[0].finish_reason else reason
        return content, calls, reason

    content, calls, reason = ask(tool_choice="required")
    assert reason == "tool_calls" and calls and calls[0].function.name in ("get_weather", "get_time")
    args = json.loads(calls[0].function.arguments)
    if calls[0].function.name == "get_weather":
        assert isinstance(args["city"], str) and isinstance(args["days"], int)
    _, named, reason = ask(tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert reason == "tool_calls" and [c.function.name for c in named] == ["get_time"]
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": calls[0].id, "type": "function",
                      "function": {"name": calls[0].function.name, "arguments": calls[0].function.arguments}}]},
                 {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 12 C"}]
    answer, more, reason = ask(tool_choice="none")
    assert isinstance(answer, str) and answer and not more and reason in ("stop", "length")


class ScriptedBackend:
    """Answers every request with the same tokens (what a model that calls a tool on its own emits)."""

    model_name = "qwen3-coder-tiny"
    supports_logprobs = False  # a `ServingBackend`'s contract: no logprobs, context unknown
    max_model_len = None

    def __init__(self, text: str):
        self.tok = load_tokenizer(self.model_name)
        self.ids = self.tok.encode(text)

    def encode(self, text):
        return self.tok.encode(text)

    def decode(self, ids, skip_special_tokens=True):
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    async def generate(self, request_id, prompt_ids, params, client="", response_id=""):
        from disaggsdk.serve.backend import TokenEvent

        for i in range(0, len(self.ids), 3):  # a few tokens per event, as a decode unit sends them
            chunk = self.ids[i:i + 3]
            yield TokenEvent(request_id, chunk, finished=i + 3 >= len(self.ids),
                             finish_reason="stop" if i + 3 >= len(self.ids) else None)

    async def abort(self, request_id):
        pass

    def stats(self, wait_s=0.0):
        return []

    def units(self):
        return None  # one engine in this process: no units to route, move or trace


def test_auto_output_is_split_into_content_and_parsed_calls():
    import asyncio

    from disaggsdk.serve.http.openai_request import parse_request
    from disaggsdk.serve.http.request_run import RequestRun
    from disaggsdk.serve.metrics import ServerMetrics

    backend = ScriptedBackend("Let me check.<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
                              "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>")
    body = {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS}
    from disaggsdk.serve.http.chat_template import model_chat_template

    req = parse_request(body, True, backend.encode, chat_template=model_chat_template(backend.model_name))
    assert req.tool_setup.choice == "auto" and req.params.structured is None  # auto: nothing forced

    async def run():
        r = RequestRun(backend, ServerMetrics(backend.stats, "fake"), "chatcmpl-1", req, backend.model_name)
        pieces = [p async for p in r.pieces(await r.start())]
        return r, pieces

    r, pieces = asyncio.run(run())
    assert r.text == "Let me check." and r.finish_reason == "tool_calls"
    (call,) = [c for p in pieces for c in p.choice["delta"].get("tool_calls", [])]  # sent once, when complete
    assert call["index"] == 0 and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo", "days": 2}
    assert "tool_call" not in "".join(p.text for p in pieces)  # the call never streams as content


def tool(name: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


MARKUP_NAMES = ["f</function>\n<tool_call>", "get weather", "f>", "é", "x" * 65, ""]


def test_tool_names_are_checked_as_openai_requires():
    ids = {"<tool_call>": 3, "</tool_call>": 4}.get
    assert check_tools({"tools": [tool("get_weather-2", {}, [])]})  # letters, digits, _ and -
    for name in MARKUP_NAMES:
        with pytest.raises(BadRequestError, match=r"\^\[a-zA-Z0-9_-\]\{1,64\}\$") as refused:
            check_tools({"tools": [TIME, tool(name, {}, [])]})
        assert refused.value.param == "tools[1].function.name" and repr(name)[:20] in str(refused.value)
        with pytest.raises(BadRequestError, match="not a valid function name") as refused:
            parse_tool_choice({"tool_choice": {"type": "function", "function": {"name": name}}}, TOOLS, ids)
        assert refused.value.param == "tool_choice.function.name"
    for key in ["a</parameter>\n<b", "a>", "a\nb", ""]:  # the call format writes <parameter=KEY>
        with pytest.raises(BadRequestError, match="parameter's name") as refused:
            check_tools({"tools": [tool("f", {key: {"type": "integer"}}, [])]})
        assert refused.value.param == "tools[0].function.parameters.properties"
    for parameters, field in [({"properties": [1]}, "properties"), ({"required": "n"}, "required"),
                              ({"required": [["n"]]}, "required")]:
        with pytest.raises(BadRequestError, match=f"parameters.{field} must be") as refused:
            check_tools({"tools": [{"type": "function", "function": {"name": "f", "parameters": parameters}}]})
        assert refused.value.param == f"tools[0].function.parameters.{field}"


def test_a_tool_name_with_markup_is_a_400_not_a_500(deployment):
    import httpx

    bad = tool("f</function>\n<tool_call>", {"n": {"type": "integer"}}, ["n"])
    with httpx.Client(base_url=deployment.url, timeout=60) as client:
        for choice in ["required", "auto", {"type": "function", "function": {"name": "f</function>\n<tool_call>"}}]:
            r = client.post("/v1/chat/completions", json={
                "model": deployment.model_name, "messages": [{"role": "user", "content": "call it"}],
                "tools": [bad], "tool_choice": choice, "max_tokens": 16})
            error = r.json()["error"]
            assert r.status_code == 400 and error["type"] == "invalid_request_error", r.text
            assert error["param"] == "tools[0].function.name" and "^[a-zA-Z0-9_-]{1,64}$" in error["message"]
            assert "f</function>" in error["message"]


TYPED = tool("f", {"n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"},
                   "s": {"type": "string"}}, ["n", "x", "b", "s"])


def test_forced_numbers_are_json_literals_and_parsed_values_take_the_declared_type():
    tok = load_tokenizer("qwen3-coder-tiny")
    s = ToolSetup((TYPED,), "required", None, tok.encode("<tool_call>")[0], tok.encode("</tool_call>")[0])

    def call(n: str, x: str) -> str:
        return (f"<tool_call>\n<function=f>\n<parameter=n>\n{n}\n</parameter>\n<parameter=x>\n{x}\n</parameter>\n"
                "<parameter=b>\ntrue\n</parameter>\n<parameter=s>\n007\n</parameter>\n</function>\n</tool_call>")

    def accepted(text: str) -> bool:
        grammar = GrammarState(forced_calls(s), ll_tokenizer("qwen3-coder-tiny"))
        return all(grammar.accept(t) for t in tok.encode(text))

    assert accepted(call("-123", "0.25")) and accepted(call("0", "-7"))
    for n, x in [("-0123", "1"), ("007", "1"), ("1", "01.5"), ("1", "-00")]:  # no JSON number
        assert not accepted(call(n, x)), (n, x)
    # what a model writes freely (auto) is read by the declared type: numbers, booleans, strings kept
    (parsed,) = parse_calls(call("-0123", "2.50"), s)
    assert json.loads(parsed["function"]["arguments"]) == {"n": -123, "x": 2.5, "b": True, "s": "007"}
    (parsed,) = parse_calls(call("NaN", "1e999"), s)  # no JSON value: kept as the text, never NaN
    assert json.loads(parsed["function"]["arguments"])["n"] == "NaN"
    assert json.loads(parsed["function"]["arguments"])["x"] == "1e999"


def test_forced_calls_return_the_declared_json_types(deployment):
    import httpx

    with httpx.Client(base_url=deployment.url, timeout=60) as client:
        for seed in range(12):  # before the fix, 3 of these 12 gave "n" or "x" as a string ("000075")
            r = client.post("/v1/chat/completions", json={
                "model": deployment.model_name, "messages": [{"role": "user", "content": "call it"}],
                "tools": [TYPED], "tool_choice": "required", "max_tokens": 120, "temperature": 1.0, "seed": seed})
            assert r.status_code == 200, r.text
            for c in r.json()["choices"][0]["message"]["tool_calls"]:
                args = json.loads(c["function"]["arguments"])
                assert type(args["n"]) is int and type(args["x"]) in (int, float), (seed, args)
                assert type(args["b"]) is bool and type(args["s"]) is str, (seed, args)


def test_a_forced_value_that_spells_a_special_token_is_answered(deployment):
    import httpx

    marked = tool("f", {"tag": {"enum": ["<tool_call>", "<|im_end|>"]}}, ["tag"])
    with httpx.Client(base_url=deployment.url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json={
            "model": deployment.model_name, "messages": [{"role": "user", "content": "call it"}],
            "tools": [marked], "tool_choice": "required", "max_tokens": 120})
        assert r.status_code == 200, r.text  # was a 500: "the output's grammar cannot continue"
        calls = r.json()["choices"][0]["message"]["tool_calls"]  # one or more: the grammar allows several
        assert calls and all(json.loads(c["function"]["arguments"])["tag"] in ("<tool_call>", "<|im_end|>")
                             for c in calls)
        r = client.post("/v1/chat/completions", json={
            "model": deployment.model_name, "messages": [{"role": "user", "content": "tag"}], "max_tokens": 40,
            "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": {"const": "<tool_call>"}}}})
        assert r.status_code == 200, r.text
        assert json.loads(r.json()["choices"][0]["message"]["content"]) == "<tool_call>"
