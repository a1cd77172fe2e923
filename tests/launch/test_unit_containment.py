"""No request can poison a deployment, and a unit that stops is routed around (issue 33), on a
launched deployment (one prefill and two decode units, over HTTP):

* the probe's 70,000-string choice list is a 400 for its size, before anything compiles it (the
  server compiled it for 5 s before, then a unit died building it), and /health answers 200
  meanwhile; a choice list just under the grammar limit is served;
* a decode unit handed a request whose grammar it cannot build (past the HTTP edge's check) answers
  that request with an error and serves the next ones: it used to die, and the router's retry took
  the other decode unit with it;
* a decode unit stopped with SIGSTOP is down in /health and /metrics within `serve.unit_stall_s`,
  its waiting request moves and completes on the other unit, new requests go there, and once
  continued it is up and serving again;
* a decode unit stopped for `serve.unit_unreachable_s` (not even its heartbeat heard) ends the
  request it was streaming with an error that says to retry, instead of holding it until it wakes;
  continued, it reads the abort the router sent, gives its pages back and serves again.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import attrs
import pytest

pytest.importorskip("torch")
pytest.importorskip("llguidance")
httpx = pytest.importorskip("httpx")

from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.structured.output import StructuredOutput  # noqa: E402
from disaggsdk.face.deployment import launch  # noqa: E402
from disaggsdk.launch import messages as ch  # noqa: E402
from tests.launch._helpers import make_spec  # noqa: E402

UNIT_STALL_S = 3.0
UNIT_UNREACHABLE_S = 6.0
PROBE_CHOICES = [f"option number {i}" for i in range(70_000)]  # 689 KB as JSON, as the probe sent
PLAIN = SamplingParams(max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def deployment():
    spec = make_spec("qwen3-coder-tiny", decode_replicas=2, num_pages=128, budget=32)
    spec = attrs.evolve(spec, engine=attrs.evolve(spec.engine, compile=False),
                        serve=attrs.evolve(spec.serve, unit_stall_s=UNIT_STALL_S, unit_unreachable_s=UNIT_UNREACHABLE_S,
                                                         routing="least_loaded"))
    with launch(spec, port=0, max_restarts=0) as d:
        yield d
        assert not d.backend.runtime.failures  # no unit died in any test of this module


def chat(client, **body):
    return client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Pick one."}],
                                                      "max_tokens": 8} | body)


def test_the_probes_choice_list_is_a_quick_400_while_health_answers(deployment):
    with httpx.Client(base_url=deployment.url, timeout=60) as client:
        # the server builds its grammar tokenizer once, on the first structured request (~1 s)
        first = chat(client, structured_outputs={"choice": ["yes", "no"]})
        assert first.status_code == 200, first.text
        health_codes, done = [], threading.Event()

        def poll_health():
            while not done.is_set():
                health_codes.append(client.get("/health").status_code)

        # Latencies are not asserted (tests assert behaviour: a 2-core CI box shared with three
        # units stalls any process now and then), only that /health kept answering 200.
        poller = threading.Thread(target=poll_health)
        poller.start()
        try:
            r = chat(client, structured_outputs={"choice": PROBE_CHOICES})
            fits = [f"o{i}" for i in range(12_000)]  # ~120 KB of grammar: under the limit, served
            ok = chat(client, structured_outputs={"choice": fits}, max_tokens=12, temperature=0)
        finally:
            done.set()
            poller.join()
        assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs"
        assert "over the limit" in r.json()["error"]["message"]  # refused by size: nothing compiled it
        assert health_codes and set(health_codes) == {200}, health_codes
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] in fits, ok.text


def test_a_unit_answers_a_request_whose_grammar_it_cannot_build_and_serves_on(deployment):
    router = deployment.backend
    poisons = [SamplingParams(max_tokens=4, structured=StructuredOutput.choice(PROBE_CHOICES)),
               SamplingParams(max_tokens=4, structured=StructuredOutput("regex", "(unclosed"))]
    for params in poisons:  # past the HTTP edge's check: straight to the decode units, twice each
        for events in router.generate_batch([[5, 6, 7, 8], [9, 10, 11, 12]], params, timeout_s=60):
            assert events[-1].finish_reason == "error" and "structured output" in events[-1].error
            assert events[-1].instance.startswith("decode-")  # the unit's own answer, not its death
    assert not router.runtime.failures
    regex = SamplingParams(max_tokens=6, structured=StructuredOutput("regex", "[a-c]{2}x"))
    for events in router.generate_batch([[5, 6, 7], [8, 9, 10]], [PLAIN, regex], timeout_s=60):
        assert events[-1].finished and events[-1].finish_reason in ("length", "stop")
    # every unit is still the one that started (none died); not `router.stats()`'s health, which also
    # reads a unit silent for serve.unit_stall_s as unhealthy: on this 2-core box a unit can be
    # starved that long while it serves on (seen once in a full-suite run, 2026-12-06)
    assert {name: u.healthy for name, u in router.runtime.units.items()} == dict.fromkeys(
        ["prefill-0", "decode-0", "decode-1"], True)


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_a_stopped_decode_unit_is_stalled_routed_around_and_serves_again_when_continued(deployment):
    router, rt = deployment.backend, deployment.backend.runtime
    pid = rt.units["decode-1"].process.pid
    # start the stall clock at the stop: a unit still busy with the previous test's work (a big grammar)
    # can have been silent for most of serve.unit_stall_s already, and would read as stalled before the
    # router routes to it below (failed once so in a full-suite run, 2026-12-06)
    wait_for(lambda: rt._stalls.silent_s("decode-1", time.monotonic()) < 0.5 and rt.is_healthy("decode-1"),
             30, "decode-1 was not heard from recently")
    with httpx.Client(base_url=deployment.url, timeout=60) as client:
        instances = lambda: client.get("/health").json()["instances"]  # noqa: E731
        os.kill(pid, signal.SIGSTOP)
        try:
            stopped_s = time.monotonic()
            done, events = threading.Event(), []

            def sink(ev):
                events.append(ev)
                if ev.finished:
                    done.set()

            # the router does not know yet: least_loaded sends the second one to the stopped unit
            fine = []
            assert router.submit("fine", [1, 2, 3], PLAIN, fine.append) == "decode-0"
            assert router.submit("waits-on-stopped", [5, 6, 7, 8], PLAIN, sink) == "decode-1"
            wait_for(lambda: instances()["decode-1"] == "down", UNIT_STALL_S + 5, "decode-1 never read down")
            assert time.monotonic() - stopped_s >= UNIT_STALL_S * 0.9
            assert client.get("/health").json()["status"] == "degraded"
            assert ('disaggsdk_engine_healthy{engine="decode-1",model_name="qwen3-coder-tiny",role="decode"} 0.0'
                    in client.get("/metrics").text)
            assert done.wait(60), "the waiting request did not move"
            assert events[-1].finish_reason == "length" and events[-1].instance == "decode-0"
            assert sum(len(ev.new_token_ids) for ev in events) == 4
            assert fine[-1].finish_reason == "length" and fine[-1].instance == "decode-0"
            for events in router.generate_batch([[1, 2, 3]] * 3, PLAIN, timeout_s=60):
                assert events[-1].finish_reason == "length" and events[-1].instance == "decode-0"
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: instances()["decode-1"] == "up", 2 * UNIT_STALL_S + 5, "decode-1 never came back")
        served = {events[-1].instance for events in router.generate_batch([[4, 3, 2, 1]] * 4, PLAIN, timeout_s=60)
                  if events[-1].finish_reason == "length"}
        assert served == {"decode-0", "decode-1"}
        assert client.get("/health").json()["status"] == "ok"


def test_a_unit_stopped_past_unit_unreachable_s_ends_its_stream_with_a_retryable_error_and_frees_it_on_waking(
        deployment):
    router, rt = deployment.backend, deployment.backend.runtime
    # the KV pool holds 512 tokens; ~1 s of decoding on this box, and the unit is stopped at its first tokens
    STREAM_TOKENS = 500
    wait_for(lambda: rt.is_healthy("decode-0") and rt.is_healthy("decode-1"), 30, "a decode unit is not healthy")
    streaming, done = [], threading.Event()

    def sink(ev):
        streaming.append(ev)
        if ev.finished:
            done.set()

    heard = []  # what the units say, as the router hears it (it drops what it no longer waits for)
    listener = rt._on_message

    def record(name, msg):
        heard.append((name, msg))
        listener(name, msg)

    rt._on_message = record
    unit = router.submit("streams", [3, 1, 4, 1, 5], SamplingParams(max_tokens=STREAM_TOKENS, ignore_eos=True), sink)
    pid = rt.units[unit].process.pid
    wait_for(lambda: streaming, 30, "the request never streamed")
    assert not streaming[-1].finished, streaming
    os.kill(pid, signal.SIGSTOP)
    stopped_s = time.monotonic()
    try:
        assert done.wait(UNIT_UNREACHABLE_S + 20), "the stream was held past serve.unit_unreachable_s"
        ended_after_s = time.monotonic() - stopped_s
        assert not rt.is_healthy(unit)
    finally:
        os.kill(pid, signal.SIGCONT)
    last = streaming[-1]
    assert last.finish_reason == "error" and f"{unit} is unreachable" in last.error and "retry" in last.error
    assert ended_after_s >= UNIT_UNREACHABLE_S * 0.9  # not before its heartbeat was missed that long
    assert 0 < sum(len(ev.new_token_ids) for ev in streaming) < STREAM_TOKENS
    wait_for(lambda: rt.is_healthy(unit), 30, f"{unit} never came back")
    # it read the router's abort once continued (and answered it), and every page it held is free again
    wait_for(lambda: any(name == unit and isinstance(msg, ch.Tokens) and msg.request_id == "streams"
                         and msg.finish_reason == "abort" for name, msg in heard), 30, f"{unit} never read the abort")
    rt._on_message = listener

    def all_free():
        router.reset_prefix_cache()
        return all(st.num_free_pages == st.num_pages for st in router.unit_stats().values())

    wait_for(all_free, 30, f"{unit} kept the aborted stream's pages")
    events = router.generate_batch([[2, 7, 1, 8]] * 2, PLAIN, timeout_s=60)
    assert all(evs[-1].finish_reason == "length" for evs in events)


def test_a_move_to_a_stopped_unit_ends_once_the_router_judges_it_unreachable(deployment):
    """Issue 55 (8): the move waited for the source's own deadline (transfer.deadline_s, 30 s here) though
    the router had judged its target unreachable at serve.unit_unreachable_s; the request paused meanwhile."""
    router, rt = deployment.backend, deployment.backend.runtime
    wait_for(lambda: rt.is_healthy("decode-0") and rt.is_healthy("decode-1"), 30, "a decode unit is not healthy")
    streaming, done = [], threading.Event()

    def sink(ev):
        streaming.append(ev)
        if ev.finished:
            done.set()

    source = router.submit("moves", [2, 7, 1, 8], SamplingParams(max_tokens=400, ignore_eos=True), sink)
    target = "decode-1" if source == "decode-0" else "decode-0"
    wait_for(lambda: streaming, 30, "the request never streamed")
    pid = rt.units[target].process.pid
    os.kill(pid, signal.SIGSTOP)
    stopped_s = time.monotonic()
    try:
        outcome = router.move("moves", target)  # the router does not know yet: it reads the target healthy
        moved = outcome.result(UNIT_UNREACHABLE_S + 20)
        ended_after_s = time.monotonic() - stopped_s
    finally:
        os.kill(pid, signal.SIGCONT)
    assert not moved.moved and f"{target} is unreachable" in moved.reason, moved
    assert ended_after_s < UNIT_UNREACHABLE_S + 10 < deployment.backend.spec.transfer.deadline_s
    assert done.wait(60) and streaming[-1].finish_reason == "length" and streaming[-1].instance == source
    assert sum(len(ev.new_token_ids) for ev in streaming) == 400  # resumed at the source, whole
    wait_for(lambda: rt.is_healthy(target), 30, f"{target} never came back")
