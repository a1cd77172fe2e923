"""Moving requests of a running deployment from outside it: `disaggsdk move` / `disaggsdk drain`
over the authenticated control endpoints, and `Deployment.move` / `drain` in Python. A streaming
HTTP client's completion is the unmoved one; bad calls are a message and exit code 2."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

pytest.importorskip("torch")

from disaggsdk.cli.main import main
from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.face.cluster import Cluster
from disaggsdk.serve.moves.request_moves import MoveError
from tests.launch._helpers import make_spec

KEY = "control-test-key"
PROMPT = [11, 12, 13, 14, 15, 16, 17]
MAX_TOKENS = 150


class StreamingClient(threading.Thread):
    """One streamed completion, with the client's own request id; ``first`` is set at its first token."""

    def __init__(self, url: str, request_id: str):
        super().__init__(daemon=True)
        self.url, self.request_id = url, request_id
        self.first = threading.Event()
        self.tokens: list[str] = []
        self.finish_reason = None

    def run(self) -> None:
        body = {"model": "qwen3-coder-tiny", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "stream": True,
                "ignore_eos": True, "temperature": 0}
        headers = {"Authorization": f"Bearer {KEY}", "X-Request-Id": self.request_id}
        with httpx.stream("POST", f"{self.url}/v1/completions", json=body, headers=headers, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choice = json.loads(line[6:])["choices"][0]
                self.tokens.append(choice["text"])
                self.first.set()
                self.finish_reason = choice.get("finish_reason") or self.finish_reason


@pytest.fixture(scope="module")
def deployment():
    spec = make_spec("qwen3-coder-tiny", decode_replicas=2, num_pages=256, budget=64)
    with Cluster(spec).launch(port=0, api_key=KEY, on_progress=lambda _l: None) as d:
        yield d


@pytest.fixture(scope="module")
def unmoved_text(deployment):
    with LLMEngine("qwen3-coder-tiny", EngineConfig(page_size=4, num_pages=256)) as engine:
        ids = engine.generate([PROMPT], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))[0].output_ids
    return deployment.backend.decode(ids, skip_special_tokens=True)


def where(d, request_id: str) -> str:
    unit = d.backend.unit_of(d.backend.resolve_request_id(request_id))
    assert unit is not None, f"{request_id} is not in flight"
    return unit


def test_the_move_command_moves_a_streaming_request_which_completes_as_unmoved(deployment, unmoved_text, capsys):
    client = StreamingClient(deployment.url, "moving-1")
    client.start()
    assert client.first.wait(60)
    source = where(deployment, "moving-1")
    target = "decode-1" if source == "decode-0" else "decode-0"
    assert main(["move", deployment.url, "moving-1", "--to", target, "--api-key", KEY]) == 0
    assert f"moved from {source} to {target}" in capsys.readouterr().out
    client.join(120)
    assert "".join(client.tokens) == unmoved_text and client.finish_reason == "length"


def test_the_drain_command_empties_a_unit_and_undo_routes_to_it_again(deployment, unmoved_text, capsys):
    clients = [StreamingClient(deployment.url, f"drained-{i}") for i in range(3)]
    for c in clients:
        c.start()
    for c in clients:
        assert c.first.wait(60)
    unit = where(deployment, "drained-0")
    assert main(["drain", deployment.url, unit, "--api-key", KEY]) == 0
    assert f"{unit}: drained" in capsys.readouterr().out
    for c in clients:
        c.join(120)
        assert "".join(c.tokens) == unmoved_text
    assert main(["drain", deployment.url, unit, "--undo", "--api-key", KEY]) == 0


def test_bad_control_calls_are_a_message_and_exit_code_2(deployment, capsys):
    assert main(["move", deployment.url, "nobody", "--to", "decode-1", "--api-key", KEY]) == 2
    assert "not in flight" in capsys.readouterr().err
    assert main(["drain", deployment.url, "prefill-0", "--api-key", KEY]) == 2
    assert "not a decode unit" in capsys.readouterr().err
    assert main(["drain", deployment.url, "decode-0", "--api-key", "wrong"]) == 2
    assert "401" in capsys.readouterr().err
    r = httpx.post(f"{deployment.url}/requests/x/move", json={"to": 3}, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "to"


def test_deployment_moves_in_python(deployment, unmoved_text):
    client = StreamingClient(deployment.url, "py-1")
    client.start()
    assert client.first.wait(60)
    source = where(deployment, "py-1")
    target = "decode-1" if source == "decode-0" else "decode-0"
    outcome = deployment.move("py-1", to=target)
    assert outcome.moved and outcome.target == target and outcome.num_bytes > 0
    with pytest.raises(MoveError, match="not another healthy decode unit"):
        deployment.move("py-1", to=target)  # it is there now
    client.join(120)
    assert "".join(client.tokens) == unmoved_text
    report = deployment.drain(target, timeout_s=10)
    assert report.drained
    deployment.undrain(target)


def test_the_load_shift_driver_runs_its_phases_against_a_live_server(deployment):
    from disaggsdk.bench.load_shift import Phase, run_load_shift

    phases = [Phase("short", 1.0, 6, 8, 4), Phase("long", 1.0, 3, 64, 2)]
    doc = run_load_shift(deployment.url, deployment.model_name, phases, ttft_ms=60_000, tpot_ms=60_000, api_key=KEY)
    assert doc["failed"] == 0 and doc["requests"] == sum(p["requests"] for p in doc["phases"]) > 0
    assert [p["name"] for p in doc["phases"]] == ["short", "long"]
    assert all(p["attainment"] == 1.0 for p in doc["phases"] if p["requests"])
    assert len(doc["outputs"]) == doc["requests"] and all(doc["outputs"])


def test_the_rebalance_command_changes_roles_and_back(deployment, unmoved_text, capsys):
    client = StreamingClient(deployment.url, "rebalanced-1")
    client.start()
    assert client.first.wait(60)
    assert main(["rebalance", deployment.url, "--prefill", "2", "--decode", "1", "--api-key", KEY]) == 0
    out = capsys.readouterr().out
    assert "decode -> prefill" in out and "roles now:" in out
    client.join(120)
    assert "".join(client.tokens) == unmoved_text  # it streamed on across the change
    assert main(["rebalance", deployment.url, "--prefill", "2", "--decode", "2", "--api-key", KEY]) == 2
    assert "3 prefill and decode units" in capsys.readouterr().err  # the counts do not add up
    assert main(["rebalance", deployment.url, "--prefill", "1", "--decode", "2", "--api-key", KEY]) == 0
    assert sorted(deployment.backend.unit_roles().values()) == ["decode", "decode", "prefill"]
