"""The front end never stalls the deployment against itself.

A client's 8 MB prompt (~4M tokens, under the body limit) once held the GIL for 9-27 s while it was
tokenized: the HTTP server froze, the thread that reads the units' heartbeats too, and the router then
took its own stall for the units' (`serve.unit_unreachable_s`), ending every other client's stream.
Here a live deployment streams three requests while two such prompts arrive and while this process
(the router's) is held up past `serve.unit_unreachable_s` outright: every stream completes with the
tokens it has alone, and no unit is taken for unreachable. The big prompts come in every shape a
prompt takes (text, chat messages, a list of texts, token ids; to /v1 and to /tokenize): each is a
400 that names the context.
"""

from __future__ import annotations

import json
import threading
import time

import attrs
import pytest

httpx = pytest.importorskip("httpx")

from disaggsdk.face.deployment import launch  # noqa: E402
from disaggsdk.spec import load_spec  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

UNREACHABLE_S = 2.0  # small, so that a stall of a few seconds would cross it
STREAM_TOKENS = 1200  # streams that outlast the stalls below (400 did not, once prefill and decode got faster)
PROMPTS = ["def fib(n):", "class Stack:", "import os\n"]
BIG_PROMPT = "a " * 4_000_000  # 8 MB: 4M tokens under the tiny model's tokenizer, below the 8 MiB body limit


@pytest.fixture(scope="module")
def deployment():
    spec = load_spec(ROOT / "specs/tiny_local.yaml")
    spec = attrs.evolve(spec, engine=attrs.evolve(spec.engine, compile=False),
                        serve=attrs.evolve(spec.serve, unit_unreachable_s=UNREACHABLE_S))
    said: list[str] = []  # the runtime's lines: "unit X unreachable: ..." is what must not appear
    with launch(spec, port=0, max_restarts=0, on_event=said.append) as d:
        d.said = said
        yield d


def stream_text(url: str, prompt: str, out: dict[str, object], first: threading.Event | None = None) -> None:
    """Stream one completion; ``out`` gets its text and finish reason, or the error that ended it;
    ``first`` is set once its first token came (or it ended)."""
    body = {"prompt": prompt, "max_tokens": STREAM_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
    text, finish = [], None
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out["error"] = chunk["error"]
                    return
                choice = chunk["choices"][0]
                text.append(choice["text"])
                if first is not None:
                    first.set()
                finish = choice["finish_reason"] or finish
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
        return
    finally:
        if first is not None:
            first.set()
    out["text"], out["finish"] = "".join(text), finish


def hold_the_gil(seconds: float) -> None:
    """Keep this process's GIL for about ``seconds``: a C loop that never lets go of it."""
    start = time.monotonic()
    sum(range(2_000_000))
    per_item_s = max((time.monotonic() - start) / 2_000_000, 1e-10)
    sum(range(int(seconds / per_item_s)))


def test_big_prompts_and_a_held_up_router_end_no_other_clients_stream(deployment):
    d = deployment
    alone: list[dict[str, object]] = [{} for _ in PROMPTS]
    for prompt, out in zip(PROMPTS, alone):
        stream_text(d.url, prompt, out)
    assert all(o.get("finish") == "length" for o in alone), alone

    results: list[dict[str, object]] = [{} for _ in PROMPTS]
    firsts = [threading.Event() for _ in PROMPTS]
    streams = [threading.Thread(target=stream_text, args=(d.url, p, o, f)) for p, o, f in zip(PROMPTS, results, firsts)]
    for t in streams:
        t.start()
    for f in firsts:
        assert f.wait(120)
    answers: list[httpx.Response] = []

    def big(path: str, body: dict[str, object]) -> None:
        answers.append(httpx.post(f"{d.url}{path}", json=body, timeout=300))

    # every shape a megabyte prompt comes in, at once: as text, as chat, as a list of texts, as token ids
    half = BIG_PROMPT[: len(BIG_PROMPT) // 2]
    bigs = [threading.Thread(target=big, args=shape) for shape in (
        ("/v1/completions", {"prompt": BIG_PROMPT, "max_tokens": 4}),
        ("/tokenize", {"prompt": BIG_PROMPT}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": BIG_PROMPT}], "max_tokens": 4}),
        ("/tokenize", {"messages": [{"role": "user", "content": half}, {"role": "assistant", "content": half}]}),
        ("/v1/completions", {"prompt": [half, half], "max_tokens": 4}),
        ("/v1/completions", {"prompt": [7] * 1_000_000, "max_tokens": 4}),
    )]
    for t in bigs:
        t.start()
    for t in bigs:
        t.join()
    streaming_when_held = sum(t.is_alive() for t in streams)
    hold_the_gil(3 * UNREACHABLE_S)  # the router's own process held up, as by any long C call
    for t in streams:
        t.join(timeout=300)

    # what follows judged streams that ran through both stalls (each takes seconds; the prompts less)
    assert streaming_when_held == len(streams), results
    assert not [line for line in d.said if "unreachable" in line or "stalled" in line]
    assert results == alone  # every stream ended as it does alone: all its tokens, none lost
    assert [a.status_code for a in answers] == [400] * len(bigs), [a.text[:300] for a in answers]
    assert all("context" in a.json()["error"]["message"] for a in answers)
    assert all(h == "up" for h in httpx.get(f"{d.url}/health").json()["instances"].values())
    assert not d.backend.runtime.failures
