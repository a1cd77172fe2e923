"""Agent session traces: the shipped coding-agent trace and its generator, reading a trace (and
refusing a bad one), the run by turn, replay against a scripted server (a session's turn waits for
its previous answer, concurrency holds), and `disaggsdk bench --dataset-name agent-trace` end to end."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from disaggsdk.bench.agent_trace import (
    AgentSession,
    AgentTurn,
    agent_trace_lines,
    agent_trace_workload,
    read_agent_trace,
)
from disaggsdk.bench.coding_agent_trace import (
    SHIPPED_TRACE,
    CodingAgentShape,
    coding_agent_sessions,
    main,
    working_set_pages,
)
from disaggsdk.bench.dataset import RANDOM_TOKEN_ID_LIMIT, BenchRequest, DatasetError
from disaggsdk.bench.serve_bench import LoadShape, bench
from disaggsdk.bench.serve_request import RequestOptions
from disaggsdk.bench.stream_timeline import StreamTimeline
from disaggsdk.bench.turn_summary import output_digest, send_order_reuse, turn_summary
from tests.conftest import ROOT

SMALL = CodingAgentShape(num_sessions=3, num_turns=3, system_len=40, repo_context_len=(20, 30), reply_len=(3, 5),
                         tool_output_len=(10, 20), max_context_tokens=512)


# the shipped trace and its generator

def test_the_shipped_trace_is_what_the_generator_writes(tmp_path):
    assert SHIPPED_TRACE.read_text() == agent_trace_lines(coding_agent_sessions())
    out = tmp_path / "t.jsonl"
    main(["--out", str(out), "--sessions", "2", "--turns", "3"])
    assert read_agent_trace(out) == coding_agent_sessions(CodingAgentShape(num_sessions=2, num_turns=3))


def test_each_turn_resends_the_previous_prompt_and_reply_and_the_context_grows():
    shape = CodingAgentShape()
    sessions = read_agent_trace(SHIPPED_TRACE)
    assert len(sessions) == shape.num_sessions and {len(s.turns) for s in sessions} == {shape.num_turns}
    system = sessions[0].prompts()[0][:shape.system_len]
    for session in sessions:
        prompts = session.prompts()
        assert prompts[0][:shape.system_len] == system  # one system prompt for all
        assert 800 <= len(prompts[0]) <= 1200 and 2400 <= len(prompts[-1])  # ~1,000 growing to ~3,000
        assert len(session.final_context()) <= shape.max_context_tokens
        for turn, before, after in zip(session.turns, prompts, prompts[1:]):
            # turn k+1 = turn k's prompt + turn k's recorded reply + a tool output
            assert after[:len(before)] == before
            assert after[len(before):len(before) + len(turn.output_token_ids)] == list(turn.output_token_ids)
            assert len(after) - len(before) - len(turn.output_token_ids) >= shape.tool_output_len[0]
        assert all(0 <= t < RANDOM_TOKEN_ID_LIMIT for t in session.final_context())
    # sessions differ after the system prompt
    assert sessions[0].prompts()[0][shape.system_len:] != sessions[1].prompts()[0][shape.system_len:]


def test_a_session_does_not_depend_on_how_many_there_are():
    few = coding_agent_sessions(CodingAgentShape(num_sessions=2, num_turns=3))
    many = coding_agent_sessions(CodingAgentShape(num_sessions=5, num_turns=4))
    assert [s.turns[:3] for s in many[:2]] == [s.turns for s in few]
    assert coding_agent_sessions(SMALL, seed=1) != coding_agent_sessions(SMALL, seed=2)


def test_the_working_set_is_at_least_eight_times_the_measurement_specs_pool():
    from disaggsdk.spec import load_spec

    spec = load_spec(ROOT / "specs" / "kv_tiers_agent.yaml")
    assert spec.engine.num_pages is not None and spec.engine.max_model_len is not None
    sessions = read_agent_trace(SHIPPED_TRACE)
    assert working_set_pages(sessions, spec.kv.page_size) >= 8 * spec.engine.num_pages
    # every request fits the spec's max_model_len, and two of the longest fit the pool at once
    longest = max(len(s.final_context()) for s in sessions)
    assert longest <= spec.engine.max_model_len and 2 * longest <= spec.engine.num_pages * spec.kv.page_size


def test_working_set_pages_counts_a_shared_prefix_once_and_each_partial_page():
    a = AgentSession(0, (AgentTurn((1, 2, 3, 4, 5), (6,)),))  # 6 tokens: pages [1-4], [5, 6]
    b = AgentSession(1, (AgentTurn((1, 2, 3, 4, 9), (9, 9, 9)),))  # [1-4] shared, [9, 9, 9, 9]
    assert working_set_pages([a], 4) == 2 and working_set_pages([a, b], 4) == 3
    with pytest.raises(ValueError, match="page_size"):
        working_set_pages([a], 0)


def test_a_session_that_would_not_fit_is_refused():
    with pytest.raises(ValueError, match="max_context_tokens"):
        coding_agent_sessions(CodingAgentShape(num_sessions=1, max_context_tokens=2000))


# reading a trace

def test_a_trace_reads_back_as_written_and_cuts_to_sessions_and_turns(tmp_path):
    sessions = coding_agent_sessions(SMALL)
    path = tmp_path / "agent.jsonl"
    path.write_text(agent_trace_lines(sessions))
    assert read_agent_trace(path) == sessions
    w = agent_trace_workload(path)
    assert len(w.conversations) == 3 and w.turns == 3
    assert [r.prompt for r in w.conversations[1]] == sessions[1].prompts()
    assert [r.output_len for r in w.conversations[1]] == [len(t.output_token_ids) for t in sessions[1].turns]
    cut = agent_trace_workload(path, max_sessions=2, max_turns=2, output_len=7)
    assert [[r.prompt for r in c] for c in cut.conversations] == [s.prompts()[:2] for s in sessions[:2]]
    assert {r.output_len for c in cut.conversations for r in c} == {7} and cut.turns == 2


def test_lines_of_sessions_may_interleave_in_any_way(tmp_path):
    rows = [{"session_id": "b", "turn": 1, "new_token_ids": [5, 6], "output_token_ids": [7]},
            {"session_id": "a", "turn": 1, "new_token_ids": [1], "output_token_ids": [2, 3]},
            {"session_id": "b", "turn": 2, "new_token_ids": [8], "output_token_ids": [9]}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    sessions = read_agent_trace(path)
    assert [s.session_id for s in sessions] == ["b", "a"]
    assert sessions[0].prompts() == [[5, 6], [5, 6, 7, 8]] and sessions[0].final_context() == [5, 6, 7, 8, 9]


GOOD = {"session_id": 0, "turn": 1, "new_token_ids": [1, 2], "output_token_ids": [3]}


@pytest.mark.parametrize("lines, message", [
    (["{not json"], "t.jsonl:1: not JSON"),
    ([json.dumps([1, 2])], "t.jsonl:1: expected an object with session_id, turn"),
    ([json.dumps({k: v for k, v in GOOD.items() if k != "output_token_ids"})], "expected an object with"),
    ([json.dumps(GOOD | {"new_token_ids": []})], "t.jsonl:1: 'new_token_ids' must be a non-empty list"),
    ([json.dumps(GOOD | {"output_token_ids": [1, -2]})], "'output_token_ids' must be a non-empty list"),
    ([json.dumps(GOOD | {"session_id": [0]})], "'session_id' must be a number or a string"),
    ([json.dumps(GOOD), json.dumps(GOOD | {"turn": 3})], "t.jsonl:2: session 0 turn 3 out of order: expected turn 2"),
    ([json.dumps(GOOD | {"turn": 2})], "expected turn 1"),
    ([""], "the trace has no turns"),
])
def test_a_bad_trace_is_refused_with_its_line(tmp_path, lines, message):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=message.replace("(", r"\(")):
        read_agent_trace(path)


def test_a_missing_trace_and_bad_limits_are_refused(tmp_path):
    with pytest.raises(DatasetError, match="cannot read it"):
        read_agent_trace(tmp_path / "missing.jsonl")
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(GOOD) + "\n")
    for kwargs, flag in (({"max_sessions": 0}, "--num-prompts"), ({"max_turns": 0}, "--multi-turn-turns"),
                         ({"output_len": 0}, "--output-len")):
        with pytest.raises(DatasetError, match=flag):
            agent_trace_workload(path, **kwargs)


# the run by turn

def timeline(sent_s: float, ttft_s: float, prompt_tokens: int, cached: int | None, ids: list[int] | None = None,
             error: str | None = None) -> StreamTimeline:
    t = StreamTimeline(sent_s, prompt_tokens=prompt_tokens)
    if error:
        t.error = error
        return t
    t.add_chunk({"choices": [{"text": "x", "token_ids": ids or []}]}, chat=False, now_s=sent_s + ttft_s)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 1,
             "prompt_tokens_details": None if cached is None else {"cached_tokens": cached}}
    t.add_chunk({"choices": [], "usage": usage}, chat=False, now_s=sent_s + ttft_s)
    return t


def test_reuse_is_counted_in_the_order_the_run_sent_the_prompts():
    prompts = [[1, 2, 3], [1, 2, 3, 4], [1, 2, 9]]
    assert send_order_reuse(prompts, [0.0, 1.0, 2.0]) == [0, 3, 2]
    assert send_order_reuse(prompts, [2.0, 1.0, 0.0]) == [3, 2, 0]  # the longest was sent first


def test_turn_summary_on_a_hand_made_run():
    a = [BenchRequest([1, 2, 3, 4], 4, 1), BenchRequest([1, 2, 3, 4, 5, 6], 6, 1)]
    b = [BenchRequest([1, 2, 7, 7], 4, 1), BenchRequest([1, 2, 7, 7, 8, 8], 6, 1)]
    # sent: a1 at 0, b1 at 1, a2 at 2, b2 at 3 (sessions interleaved)
    timelines = [timeline(0.0, 0.100, 4, 0, [5]), timeline(2.0, 0.020, 6, 4, [6]),
                 timeline(1.0, 0.300, 4, 0, [5]), timeline(3.0, 0.040, 6, 2, [7])]
    s = turn_summary([a, b], timelines)
    assert s["per_turn"] == [
        {"turn": 1, "count": 2, "failed": 0, "mean_ttft_ms": pytest.approx(200), "prompt_tokens": 8,
         "reusable_tokens": 2, "cached_tokens": 0},  # b1 shares [1, 2] with a1
        {"turn": 2, "count": 2, "failed": 0, "mean_ttft_ms": pytest.approx(30), "prompt_tokens": 12,
         "reusable_tokens": 8, "cached_tokens": 6}]
    assert s["mean_ttft_turn1_ms"] == pytest.approx(200) and s["mean_ttft_turns2plus_ms"] == pytest.approx(30)
    assert (s["prompt_tokens"], s["reusable_tokens"], s["cached_tokens"]) == (20, 10, 6)
    assert s["hit_rate"] == pytest.approx(0.6)
    # the digest follows every output token, in trace order
    assert s["output_digest"] == turn_summary([a, b], timelines)["output_digest"]
    other = timelines[:3] + [timeline(3.0, 0.040, 6, 2, [8])]
    assert turn_summary([a, b], other)["output_digest"] != s["output_digest"]


def test_a_failed_turn_counts_apart_and_unreported_cache_gives_no_hit_rate():
    a = [BenchRequest([1, 2], 2, 1), BenchRequest([1, 2, 3], 3, 1)]
    s = turn_summary([a], [timeline(0.0, 0.1, 2, None, [4]), timeline(1.0, 0.1, 3, None, error="HTTP 500")])
    assert s["per_turn"][1] == {"turn": 2, "count": 0, "failed": 1, "mean_ttft_ms": None, "prompt_tokens": 0,
                                "reusable_tokens": 0, "cached_tokens": None}
    assert s["cached_tokens"] is None and s["hit_rate"] is None and s["mean_ttft_turns2plus_ms"] is None
    assert output_digest([timeline(0.0, 0.1, 2, None)]) is None  # no token ids came back
    with pytest.raises(ValueError, match="timelines for"):
        turn_summary([a], [])


# replay against a scripted server

@pytest.fixture(scope="module")
def scripted_server():
    """A completions server that streams a chunk (with its token id) every 10 ms, logs when each
    request came and ended and how many were in flight, and reports as cached the longest prefix an
    earlier prompt shared (a perfect cache)."""
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    from disaggsdk.serve.http.http_server import HttpServer

    log, seen, bodies, in_flight, peak = [], [], [], [0], [0]
    lock = threading.Lock()

    async def complete(request):
        body, arrived_s = await request.json(), time.perf_counter()
        prompt = body["prompt"]
        cached = max((next((i for i, (x, y) in enumerate(zip(prompt, p)) if x != y), min(len(prompt), len(p)))
                      for p in seen), default=0)
        seen.append(prompt)
        bodies.append(body)
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])

        async def stream():
            for i in range(body["max_tokens"]):
                await asyncio.sleep(0.01)
                choice = {"index": 0, "text": "x", **({"token_ids": [len(prompt) % 7 + i]}
                                                      if body.get("return_token_ids") else {})}
                yield f"data: {json.dumps({'choices': [choice]})}\n\n"
            usage = {"prompt_tokens": len(prompt), "completion_tokens": body["max_tokens"],
                     "prompt_tokens_details": {"cached_tokens": cached}}
            with lock:
                in_flight[0] -= 1
            log.append((tuple(prompt), arrived_s, time.perf_counter()))  # before the body's end is sent
            yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    server = HttpServer(Starlette(routes=[Route("/v1/completions", complete, methods=["POST"])])).start()
    server.log, server.seen, server.bodies, server.peak = log, seen, bodies, peak
    yield server
    server.stop()


def reset(server) -> None:
    server.log.clear(), server.seen.clear(), server.bodies.clear()
    server.peak[0] = 0


@pytest.mark.parametrize("max_concurrency", [1, 2])
def test_replay_waits_for_each_previous_turn_and_holds_the_concurrency(tmp_path, scripted_server, max_concurrency):
    reset(scripted_server)
    path = tmp_path / "agent.jsonl"
    path.write_text(agent_trace_lines(coding_agent_sessions(SMALL)))
    w = agent_trace_workload(path)
    options = RequestOptions(return_token_ids=True)
    r = bench(scripted_server.url, w, LoadShape(max_concurrency=max_concurrency, think_time_s=0.02), model="fake",
              options=options)
    assert r["completed"] == 9 and r["max_concurrency"] == max_concurrency
    assert scripted_server.peak[0] == max_concurrency  # sessions interleave up to the cap, never past it
    assert all(b["return_token_ids"] is True and b["temperature"] == 0.0 and b["ignore_eos"] for b in
               scripted_server.bodies)
    times = {prompt: (arrived_s, ended_s) for prompt, arrived_s, ended_s in scripted_server.log}
    for turns in w.conversations:
        for before, after in zip(turns, turns[1:]):
            assert times[tuple(after.prompt)][0] - times[tuple(before.prompt)][1] >= 0.02 - 1e-3
    mt = r["multi_turn"]
    assert [t["turn"] for t in mt["per_turn"]] == [1, 2, 3] and {t["count"] for t in mt["per_turn"]} == {3}
    assert [t["prompt_tokens"] for t in mt["per_turn"]] == [sum(len(c[k].prompt) for c in w.conversations)
                                                           for k in range(3)]
    # the perfect cache served every reusable token: the hit rate is 1
    assert mt["cached_tokens"] == mt["reusable_tokens"] == r["total_cached_tokens"] and mt["hit_rate"] == 1.0
    assert mt["mean_ttft_turn1_ms"] > 0 and mt["mean_ttft_turns2plus_ms"] > 0 and mt["output_digest"]


# `disaggsdk bench --dataset-name agent-trace`

@pytest.mark.parametrize("argv, message", [
    (["--dataset-path", "missing.jsonl"], "--dataset-path missing.jsonl"),
    ([], "--dataset-name agent-trace needs --dataset-path FILE"),
    (["--dataset-path", str(SHIPPED_TRACE), "--endpoint", "/v1/chat/completions"], "use /v1/completions"),
    (["--dataset-path", str(SHIPPED_TRACE), "--num-prompts", "0"], "--num-prompts must be >= 1"),
])
def test_bad_agent_trace_options_exit_2_with_the_fix(run_cli, argv, message):
    p = run_cli("bench", "http://127.0.0.1:9", "--dataset-name", "agent-trace", *argv)  # nothing listens
    assert p.returncode == 2 and message in " ".join(p.stderr.split()) and "Traceback" not in p.stderr


def test_a_malformed_trace_exits_2_before_a_spec_starts(run_cli, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(GOOD) + "\n{oops\n")
    p = run_cli("bench", "specs/tiny_local.yaml", "--dataset-name", "agent-trace", "--dataset-path", str(path))
    assert p.returncode == 2 and "bad.jsonl:2: not JSON" in p.stderr and "Traceback" not in p.stderr


@pytest.fixture(scope="module")
def tiny_server():
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model

    with serve_model("qwen3-coder-tiny", EngineConfig(num_pages=256), port=0) as d:
        yield d


def test_bench_replays_an_agent_trace_and_two_runs_give_the_same_tokens(tiny_server, run_cli, tmp_path):
    path = tmp_path / "agent.jsonl"
    path.write_text(agent_trace_lines(coding_agent_sessions(SMALL)))
    runs = []
    for _ in range(2):
        p = run_cli("bench", tiny_server.url, "--dataset-name", "agent-trace", "--dataset-path", str(path),
                    "--num-prompts", "2", "--multi-turn-turns", "2", "--output-len", "4", "--max-concurrency", "2",
                    "--goodput", "ttft:60000", "--json")
        assert p.returncode == 0, p.stderr
        runs.append(json.loads(p.stdout))
    r = runs[0]
    assert r["completed"] == 4 and r["output_lens"] == [4] * 4 and r["request_goodput"] > 0
    mt = r["multi_turn"]
    assert mt["conversations"] == 2 and mt["turns"] == 2 and [t["count"] for t in mt["per_turn"]] == [2, 2]
    assert mt["reusable_tokens"] > 0 and mt["cached_tokens"] is not None and 0 < mt["hit_rate"] <= 1
    # greedy, fixed prompts: the second run's tokens are the first's, though its prompts hit the cache
    assert mt["output_digest"] and mt["output_digest"] == runs[1]["multi_turn"]["output_digest"]
    assert runs[1]["multi_turn"]["cached_tokens"] > mt["cached_tokens"]
