"""With one decode unit dead, no sequence of operator levers stops the deployment serving (issue 55's
acceptance): seeded random sequences of rebalance, drain, undrain and move calls with random arguments,
over the control endpoints of one live tiny deployment (one prefill and two decode units, decode-1
killed at the start with no restart left). After every step a greedy request completes with the tokens
of an unmoved run, and so does the request that streamed across the step; /health answers 200. A call
may be refused (400, 404, 409): never answered 5xx, never leaving nothing to route to."""

from __future__ import annotations

import json
import random
import threading
import time

import attrs
import httpx
import pytest

pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.face.deployment import launch
from tests.launch._helpers import make_spec

KEY = "lever-sequences-key"
HEADERS = {"Authorization": f"Bearer {KEY}"}
STREAM_PROMPT, STREAM_TOKENS = [11, 12, 13, 14, 15, 16, 17], 160  # streams across the lever call
CHECK_PROMPT, CHECK_TOKENS = [21, 22, 23, 24, 25], 8
DEAD = "decode-1"
REFUSALS = {400, 404, 409}  # what a lever may answer besides 200


@pytest.fixture(scope="module")
def deployment():
    spec = make_spec("qwen3-coder-tiny", decode_replicas=2, num_pages=256, budget=64)
    spec = attrs.evolve(spec, engine=attrs.evolve(spec.engine, compile=False))
    with launch(spec, port=0, api_key=KEY, max_restarts=0, on_progress=lambda _l: None) as d:
        d.backend.runtime.kill_unit(DEAD)
        deadline = time.monotonic() + 60
        while not any(f.startswith(f"unit {DEAD} (decode) died") for f in d.backend.runtime.failures):
            assert time.monotonic() < deadline, f"{DEAD}'s death was never reported"
            time.sleep(0.05)
        yield d


@pytest.fixture(scope="module")
def expected(deployment):
    """The unmoved greedy texts of the streamed request and of the check request."""
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (STREAM_TOKENS, CHECK_TOKENS)]
    with LLMEngine("qwen3-coder-tiny", EngineConfig(page_size=4, num_pages=256)) as engine:
        outputs = engine.generate([STREAM_PROMPT, CHECK_PROMPT], params)
    return [deployment.backend.decode(o.output_ids, skip_special_tokens=True) for o in outputs]


class Stream(threading.Thread):
    """One streamed greedy completion with its own request id; ``first`` is set at its first token."""

    def __init__(self, url: str, request_id: str):
        super().__init__(daemon=True)
        self.url, self.request_id = url, request_id
        self.first = threading.Event()
        self.text, self.finish_reason, self.failure = "", None, ""

    def run(self) -> None:
        body = {"prompt": STREAM_PROMPT, "max_tokens": STREAM_TOKENS, "stream": True, "ignore_eos": True,
                "temperature": 0}
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=120,
                              headers=HEADERS | {"X-Request-Id": self.request_id}) as r:
                if r.status_code != 200:
                    self.failure = f"HTTP {r.status_code}: {r.read().decode()}"
                    return
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        self.failure = chunk["error"]["message"]
                        return
                    self.text += chunk["choices"][0]["text"]
                    self.finish_reason = chunk["choices"][0].get("finish_reason") or self.finish_reason
                    self.first.set()
        except httpx.HTTPError as exc:
            self.failure = repr(exc)
        finally:
            self.first.set()


def random_layout(rng: random.Random, num_units: int) -> dict[str, object]:
    """A rebalance body: mostly counts that add up, now and then ones that do not."""
    prefill = rng.choice([0, *range(num_units + 1)])  # no prefill unit twice as often: two units decode then
    decode = num_units - prefill if rng.random() < 0.85 else rng.randint(0, num_units + 1)
    return {"prefill": prefill, "decode": decode}


def random_lever(rng: random.Random, units: list[str], stream_id: str, decoding: list[str]
                 ) -> tuple[str, str, dict[str, object]]:
    """One lever call with random arguments: (kind, path, body); an unknown unit now and then, and as
    often a unit that decodes now (``decoding``: a move or drain that may go through)."""
    unit = rng.choice(decoding if decoding and rng.random() < 0.5 else [*units, "decode-9"])
    kind = rng.choice(["rebalance", "rebalance", "drain", "drain", "undrain", "move", "move"])
    if kind == "rebalance":
        return kind, "/rebalance", random_layout(rng, len(units))
    if kind == "drain":
        return kind, f"/units/{unit}/drain", {"timeout_s": rng.choice([0.5, 2.0, 10.0])}
    if kind == "undrain":
        return kind, f"/units/{unit}/undrain", {}
    return kind, f"/requests/{stream_id}/move", {"to": unit}


def pull(url: str, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=HEADERS, timeout=120)


def rebalance_into(url: str, body: dict[str, object], got: list[httpx.Response]) -> None:
    got.append(pull(url, "/rebalance", body))


def run_levers(d, expected: list[str], seed: int, num_steps: int) -> dict[str, int]:
    """``num_steps`` random lever calls, each beside a stream and followed by a check request; returns
    how often each answer came (a refusal is fine, a 5xx or a wrong token is not)."""
    rng = random.Random(seed)
    units = sorted(d.backend.unit_roles())
    answers: dict[str, int] = {}
    for step in range(num_steps):
        where = f"seed {seed} step {step}"
        stream = Stream(d.url, f"s{seed}-{step}")
        stream.start()
        assert stream.first.wait(60) and not stream.failure, f"{where}: the stream failed: {stream.failure}"
        if rng.random() < 0.15:  # two rebalances at once: one runs, the other is refused (or runs after it)
            got: list[httpx.Response] = []
            threads = [threading.Thread(target=rebalance_into, args=(d.url, random_layout(rng, len(units)), got))
                       for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(180)
            statuses = sorted(r.status_code for r in got)
            assert len(statuses) == 2 and set(statuses) <= {200} | REFUSALS, f"{where}: {[r.text for r in got]}"
            label = f"2 rebalances -> {statuses}"
        else:
            decoding = [u for u, r in d.backend.unit_roles().items() if r == "decode" and u != DEAD]
            kind, path, body = random_lever(rng, units, stream.request_id, decoding)
            r = pull(d.url, path, body)
            assert r.status_code == 200 or r.status_code in REFUSALS, f"{where}: {path} {body}: {r.status_code} {r.text}"
            if r.status_code != 200:
                assert r.json()["error"]["message"], f"{where}: a refusal says why"
            label = f"{kind} -> {r.status_code}"
        answers[label] = answers.get(label, 0) + 1
        check = httpx.post(f"{d.url}/v1/completions", headers=HEADERS, timeout=120,
                           json={"prompt": CHECK_PROMPT, "max_tokens": CHECK_TOKENS, "ignore_eos": True,
                                 "temperature": 0})
        roles = d.backend.unit_roles()
        assert check.status_code == 200, f"{where} ({label}; roles {roles}): {check.status_code} {check.text}"
        assert check.json()["choices"][0]["text"] == expected[1], f"{where} ({label}): another greedy text"
        assert httpx.get(f"{d.url}/health", timeout=30).status_code == 200, f"{where} ({label})"
        stream.join(120)
        assert not stream.failure, f"{where} ({label}): the stream across the step failed: {stream.failure}"
        assert stream.text == expected[0] and stream.finish_reason == "length", f"{where} ({label}): its text"
    return answers


@pytest.mark.parametrize("seeds, num_steps", [((0,), 30), pytest.param((1, 2, 3), 80, marks=pytest.mark.slow)],
                         ids=["30-steps", "3x80-steps"])
def test_no_lever_sequence_stops_a_deployment_with_a_dead_decode_unit_serving(deployment, expected, seeds, num_steps):
    answers: dict[str, int] = {}
    for seed in seeds:
        for label, n in run_levers(deployment, expected, seed, num_steps).items():
            answers[label] = answers.get(label, 0) + n
    # the sequences did reach the states that matter: refused levers, and levers that changed something
    assert any(k.endswith("409") for k in answers) and any(k.endswith("200") for k in answers), answers
    assert not deployment.backend.runtime.is_healthy(DEAD)  # it stayed dead all along
