"""Multi-turn conversations: the seeded workload, its prefix reuse, ShareGPT multi-turn files, the
sending rule (a turn waits for the previous answer) against a scripted server, cached tokens from
usage, and `disaggsdk bench --dataset-name multi-turn` against the tiny model's server."""

from __future__ import annotations

import asyncio
import json
import random
import time

import pytest

from disaggsdk.bench.dataset import RANDOM_TOKEN_ID_LIMIT, DatasetError
from disaggsdk.bench.multi_turn import (
    MESSAGE_SEPARATOR,
    MultiTurnShape,
    prefix_reuse,
    sharegpt_conversations,
    synthetic_conversations,
)
from disaggsdk.bench.serve_bench import BenchError, LoadShape, bench
from disaggsdk.bench.serve_result import cached_token_counts
from disaggsdk.bench.stream_timeline import StreamTimeline

SHAPE = MultiTurnShape(turns=3, system_len=16, user_len=5, output_len=3)


# the workload

def test_the_same_seed_gives_the_same_prompts_and_a_conversation_does_not_depend_on_the_others():
    a = synthetic_conversations(4, SHAPE, seed=7)
    assert a == synthetic_conversations(4, SHAPE, seed=7)
    assert a.requests != synthetic_conversations(4, SHAPE, seed=8).requests
    # conversation c is seeded by (seed, c, turn): more conversations or turns leave it as it was
    assert synthetic_conversations(2, SHAPE, seed=7).conversations == a.conversations[:2]
    longer = synthetic_conversations(4, MultiTurnShape(4, 16, 5, 3), seed=7)
    assert [c[:3] for c in longer.conversations] == list(a.conversations)


def test_each_turn_resends_the_previous_prompt_and_reply_after_one_shared_system_prompt():
    w = synthetic_conversations(3, SHAPE, seed=1)
    system = w.conversations[0][0].prompt[:SHAPE.system_len]
    for turns in w.conversations:
        assert len(turns) == SHAPE.turns and turns[0].prompt[:SHAPE.system_len] == system
        assert turns[0].prompt_len == SHAPE.system_len + SHAPE.user_len
        for req in turns:
            assert req.prompt_len == len(req.prompt) and req.output_len == SHAPE.output_len
            assert all(0 <= i < RANDOM_TOKEN_ID_LIMIT for i in req.prompt)
        for before, after in zip(turns, turns[1:]):
            # turn k+1 = turn k's prompt + a synthetic reply of output_len + a user message of user_len
            assert after.prompt[:before.prompt_len] == before.prompt
            assert after.prompt_len == before.prompt_len + SHAPE.output_len + SHAPE.user_len
    assert w.conversations[0][1].prompt[20:23] != w.conversations[1][1].prompt[20:23]  # replies differ


def test_prefix_reuse_on_a_hand_made_case():
    reuse = prefix_reuse([[1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 2, 9], [7], [1, 2, 3, 4, 5, 6]])
    assert reuse.shared == (0, 4, 2, 0, 6) and reuse.prompt_lens == (4, 6, 3, 1, 6) and reuse.unit == "tokens"
    assert reuse.ratio == pytest.approx(12 / 20)
    text = prefix_reuse(["hello there", "hello world", "help"])
    assert text.shared == (0, 6, 3) and text.unit == "characters" and text.ratio == pytest.approx(9 / 26)
    assert prefix_reuse([]).ratio == 0.0


def test_prefix_reuse_total_does_not_depend_on_the_send_order():
    prompts = [req.prompt for req in synthetic_conversations(4, SHAPE, seed=3).requests]
    shuffled = prompts[:]
    random.Random(0).shuffle(shuffled)
    assert sum(prefix_reuse(prompts).shared) == sum(prefix_reuse(shuffled).shared)


def test_the_synthetic_ratio_is_what_the_structure_says():
    w = synthetic_conversations(5, SHAPE, seed=2)
    lens = [16 + 5, 16 + 5 + 3 + 5, 16 + 5 + 2 * (3 + 5)]  # turn k's prompt
    shared = 4 * 16 + 5 * (lens[0] + lens[1])  # turn 1 shares the system prompt (but the first), turn k+1 turn k
    d = w.describe()
    assert d == {"conversations": 5, "turns": 3, "system_len": 16, "user_len": 5, "prefix_reuse_unit": "tokens",
                 "prefix_reuse_ratio": pytest.approx(shared / (5 * sum(lens)), abs=0.02)}  # + chance matches


@pytest.mark.parametrize("kwargs, flag", [
    ({"turns": 0}, "--multi-turn-turns"), ({"system_len": -1}, "--multi-turn-system-len"),
    ({"user_len": 0}, "--input-len"), ({"output_len": 0}, "--output-len"),
])
def test_bad_shapes_name_the_flag_to_fix(kwargs, flag):
    with pytest.raises(DatasetError, match=flag):
        MultiTurnShape(**kwargs)


def test_no_conversations_and_a_negative_think_time_are_refused():
    with pytest.raises(DatasetError, match="--num-prompts"):
        synthetic_conversations(0)
    with pytest.raises(BenchError, match="--multi-turn-think-s"):
        LoadShape(think_time_s=-1)


# ShareGPT multi-turn files

def chat(*messages):
    return {"conversations": [{"from": who, "value": text} for who, text in messages]}


def test_sharegpt_multi_turn_prompts_hold_every_earlier_message(tmp_path):
    data = [
        chat(("system", "be brief"), ("human", "first question"), ("gpt", "first answer"),
             ("human", "second question"), ("gpt", "second answer"), ("human", "third question"), ("gpt", "third!")),
        chat(("human", "only one question"), ("gpt", "only one answer")),  # one turn: reuses nothing
        chat(("human", "a question"), ("human", "another"), ("gpt", "an answer")),  # not a chat
        chat(("human", "why is the sky"), ("gpt", "blue, mostly"), ("human", "and at night?"), ("gpt", "no"),
             ("human", "never reached"), ("gpt", "never reached")),  # "no" is too short: ends after one turn
        chat(("human", "hello there"), ("gpt", "general kenobi"), ("human", "you are a bold one"),
             ("gpt", "kill him")),
    ]
    path = tmp_path / "multi.json"
    path.write_text(json.dumps(data))
    w = sharegpt_conversations(path, 2, len, max_turns=4, seed=0)  # len: one "token" per character
    by_first = {turns[0].prompt: turns for turns in w.conversations}
    assert set(by_first) == {"be brief\n\nfirst question", "hello there"} and w.turns == 4
    system_chat = by_first["be brief\n\nfirst question"]
    assert [t.prompt for t in system_chat] == [
        "be brief\n\nfirst question",
        MESSAGE_SEPARATOR.join(["be brief", "first question", "first answer", "second question"]),
        MESSAGE_SEPARATOR.join(["be brief", "first question", "first answer", "second question", "second answer",
                                "third question"]),
    ]
    assert [t.output_len for t in system_chat] == [len("first answer"), len("second answer"), len("third!")]
    assert all(t.prompt_len == len(t.prompt) for t in system_chat)
    assert w.describe()["prefix_reuse_unit"] == "characters" and w.describe()["system_len"] is None
    capped = sharegpt_conversations(path, 2, len, max_turns=2, output_len=7)
    assert all(len(c) == 2 and {t.output_len for t in c} == {7} for c in capped.conversations)
    with pytest.raises(DatasetError, match="usable multi-turn conversations"):
        sharegpt_conversations(path, 3, len)


# cached tokens from usage

def test_cached_tokens_come_from_usage_and_are_summed_only_when_reported():
    def timeline(details, prompt_tokens=10):
        t = StreamTimeline(0.0)
        t.add_chunk({"choices": [{"text": "x"}]}, chat=False, now_s=0.1)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "prompt_tokens_details": details}
        t.add_chunk({"choices": [], "usage": usage}, chat=False, now_s=0.2)
        return t

    assert timeline({"cached_tokens": 6}).cached_tokens == 6 and timeline(None).cached_tokens is None
    assert cached_token_counts([timeline(None), timeline(None)]) == {}  # vLLM's keys alone
    counts = cached_token_counts([timeline({"cached_tokens": 6}), timeline(None, 30)])
    assert counts == {"total_cached_tokens": 6, "cached_token_ratio": pytest.approx(6 / 40)}


# the sending rule, against a scripted server

@pytest.fixture(scope="module")
def scripted_server():
    """An OpenAI completions server that streams one chunk per 20 ms, logs when each request came
    and when its response ended, and reports as cached the longest prefix of an earlier prompt."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from disaggsdk.serve.http.http_server import HttpServer

    log, seen = [], []

    async def complete(request):
        body, arrived_s = await request.json(), time.perf_counter()
        prompt = body["prompt"]
        cached = max((next((i for i, (a, b) in enumerate(zip(prompt, p)) if a != b), min(len(prompt), len(p)))
                      for p in seen), default=0)
        seen.append(prompt)

        async def stream():
            for _ in range(body["max_tokens"]):
                await asyncio.sleep(0.02)
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': 'x'}]})}\n\n"
            usage = {"prompt_tokens": len(prompt), "completion_tokens": body["max_tokens"],
                     "prompt_tokens_details": {"cached_tokens": cached}}
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"
            log.append((tuple(prompt), arrived_s, time.perf_counter()))  # before the body's end is sent

        return StreamingResponse(stream(), media_type="text/event-stream")

    server = HttpServer(Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])).start()
    server.log, server.seen = log, seen
    yield server
    server.stop()


def test_a_turn_is_sent_after_the_previous_answer_ended_and_cached_tokens_are_summed(scripted_server):
    scripted_server.log.clear(), scripted_server.seen.clear()
    w = synthetic_conversations(3, SHAPE, seed=4)
    r = bench(scripted_server.url, w, LoadShape(think_time_s=0.05), model="fake")
    assert r["completed"] == 9 and r["num_prompts"] == 9 and r["output_lens"] == [3] * 9
    assert r["input_lens"] == [req.prompt_len for req in w.requests]  # conversation by conversation
    times = {prompt: (arrived_s, ended_s) for prompt, arrived_s, ended_s in scripted_server.log}
    for turns in w.conversations:
        for before, after in zip(turns, turns[1:]):
            # turn k+1 came once turn k's response had ended, and a user's think time later
            assert times[tuple(after.prompt)][0] - times[tuple(before.prompt)][1] >= 0.05 - 1e-3
    first_turns = sorted(times[tuple(turns[0].prompt)] for turns in w.conversations)
    assert first_turns[1][0] < first_turns[0][1]  # conversations run side by side (rate inf)
    # the scripted server's cache is perfect: it served exactly the reuse the workload predicts
    assert r["total_cached_tokens"] == sum(prefix_reuse([q.prompt for q in w.requests]).shared)
    assert r["cached_token_ratio"] == pytest.approx(r["multi_turn"]["prefix_reuse_ratio"])
    workload_keys = ("conversations", "turns", "system_len", "user_len", "prefix_reuse_unit", "think_time_s")
    assert {k: r["multi_turn"][k] for k in workload_keys} == {
        "conversations": 3, "turns": 3, "system_len": 16, "user_len": 5, "prefix_reuse_unit": "tokens",
        "think_time_s": 0.05}
    # and the run by turn (tests/bench/test_agent_trace.py checks its arithmetic)
    assert r["multi_turn"]["hit_rate"] == 1.0 and [t["count"] for t in r["multi_turn"]["per_turn"]] == [3, 3, 3]
    assert r["multi_turn"]["output_digest"] is None  # token ids were not asked for


def test_max_concurrency_caps_requests_not_conversations(scripted_server):
    scripted_server.log.clear(), scripted_server.seen.clear()
    w = synthetic_conversations(3, MultiTurnShape(2, 8, 4, 2), seed=5)
    r = bench(scripted_server.url, w, LoadShape(max_concurrency=1), model="fake")
    assert r["completed"] == 6 and r["max_concurrency"] == 1
    spans = sorted((arrived_s, ended_s) for _, arrived_s, ended_s in scripted_server.log)
    assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))  # never two in flight


# end to end: `disaggsdk bench` against the tiny model's server

@pytest.fixture(scope="module")
def tiny_server():
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=256), port=0, api_key="k") as d:
        yield d


def test_bench_command_runs_a_multi_turn_load(tiny_server, run_cli):
    p = run_cli("bench", tiny_server.url, "--dataset-name", "multi-turn", "--num-prompts", "2",
                "--multi-turn-turns", "2", "--multi-turn-system-len", "32", "--input-len", "8", "--output-len", "4",
                "--api-key", "k", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["completed"] == 4 and r["num_prompts"] == 4 and r["output_lens"] == [4] * 4
    assert r["input_lens"] == [40, 52, 40, 52]  # system 32 + user 8, then + reply 4 + user 8
    assert r["multi_turn"]["conversations"] == 2 and r["multi_turn"]["turns"] == 2
    assert r["multi_turn"]["prefix_reuse_ratio"] == pytest.approx((32 + 40 + 40) / 184, abs=0.02)
    assert 0 <= r.get("cached_token_ratio", 0) <= 1 and r["mean_ttft_ms"] > 0
