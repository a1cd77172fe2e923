"""Units changing role live (real processes, real libfabric): a decode unit turns prefill after its
requests moved to the other decode unit with their KV, then prefills for it; a prefill unit turns
decode and takes requests; back again. Every request, streaming across the changes or sent after
them, gets the tokens of an unmoved run; none fails; every page and grant key returns."""

from __future__ import annotations

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.serve.backends.local import serve_locally  # noqa: E402
from disaggsdk.serve.moves.rebalance import plan_changes, rebalance  # noqa: E402
from disaggsdk.serve.moves.request_moves import MoveError  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402
from tests.launch.test_request_moves import PROMPTS, Stream, assert_nothing_held, reference  # noqa: E402

PARAMS = SamplingParams(max_tokens=120, ignore_eos=True)


def spec_for(autoscale: bool):
    spec = make_spec("qwen3-coder-tiny", decode_replicas=2, num_pages=256, budget=64, deadline_s=10.0)
    return attrs.evolve(spec, serve=attrs.evolve(spec.serve, autoscale=attrs.evolve(spec.serve.autoscale,
                                                                                     enabled=autoscale)))


def run(rt, prefix: str) -> list[Stream]:
    streams = [Stream() for _ in PROMPTS]
    for i, (prompt, s) in enumerate(zip(PROMPTS, streams)):
        rt.submit(f"{prefix}{i}", prompt, PARAMS, s)
    return streams


def finish(streams: list[Stream], want: list[list[int]]) -> None:
    for s in streams:
        assert s.done.wait(60)
    assert [s.error for s in streams] == [None] * len(streams)
    assert [s.tokens for s in streams] == want


@pytest.mark.parametrize("autoscale", [False, True], ids=["after-forward", "streamed"])
def test_units_change_role_live_and_every_request_gets_its_tokens(autoscale):
    want = reference("qwen3-coder-tiny", [PARAMS] * len(PROMPTS))
    before = live_descendants()
    with serve_locally(spec_for(autoscale), on_event=lambda _l: None) as rt:
        streaming = run(rt, "a")
        for s in streaming:
            s.wait_tokens(2)
        # one decode unit leaves decode while requests stream on it: they move, then it prefills
        report = rebalance(rt, prefill=2, decode=1)
        assert report.done, report
        (change,) = report.changes
        assert change.before == "decode" and change.after == "prefill"
        assert sorted(report.roles.values()) == ["decode", "prefill", "prefill"]
        assert all(m.moved for m in change.moves)
        finish(streaming, want)
        # new requests are prefilled by both prefill units (the decode unit spreads them) and decode on the other
        after = run(rt, "b") + run(rt, "c")
        finish(after, want + want)
        stats = rt.unit_stats()
        assert stats[change.unit].role == "prefill" and stats[change.unit].counters.transfer_bytes > 0
        # and back: the unit decodes again and takes requests
        back = rebalance(rt, prefill=1, decode=2)
        # (the last prefill unit by name turns: "prefill-0", the two prefill units being equal)
        assert back.done and [(c.unit, c.after) for c in back.changes] == [("prefill-0", "decode")], back
        again = run(rt, "d")
        finish(again, want)
        assert sorted(rt.unit_roles().values()) == ["decode", "decode", "prefill"]
        # a prefill request that reached the unit as it left prefill was refused and sent elsewhere: the only
        # handoff failures there may be
        stats = rt.unit_stats()
        refused = sum(s.counters.rejected_requests.get("leaving", 0) for s in stats.values())
        assert sum(s.counters.transfer_failures for s in stats.values()) == refused, \
            {n: (s.counters.transfer_failures, s.counters.rejected_requests) for n, s in stats.items()}
        assert_nothing_held(rt)
    assert live_descendants() <= before


def test_impossible_rebalances_are_refused_with_what_to_fix():
    roles = {"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"}
    with pytest.raises(MoveError, match="at least one must decode"):
        plan_changes(roles, {}, prefill=3, decode=0)
    with pytest.raises(MoveError, match="3 prefill and decode units"):
        plan_changes(roles, {}, prefill=2, decode=2)
    assert plan_changes(roles, {"decode-0": 3, "decode-1": 1}, prefill=2, decode=1) == [("decode-1", "prefill")]
    assert plan_changes(roles, {}, prefill=0, decode=3) == [("prefill-0", "decode")]
    assert plan_changes(roles, {}, prefill=1, decode=2) == []


def test_the_autoscale_policy_turns_a_decode_unit_when_first_tokens_miss(tmp_path, monkeypatch):
    """The whole loop, live: a TTFT SLO no request can meet makes the policy move a decode unit to prefill
    while long requests stream on it; they move with their KV and finish as unmoved; nothing fails."""
    import json
    import threading
    import time

    import httpx

    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.llm_engine import LLMEngine
    from disaggsdk.face.cluster import Cluster

    monkeypatch.setenv("DISAGGSDK_HOME", str(tmp_path))  # no calibrated profile here: decisions say so, and apply
    spec = spec_for(True)
    spec = attrs.evolve(spec, serve=attrs.evolve(spec.serve, autoscale=attrs.evolve(
        spec.serve.autoscale, ttft_ms=0.001, tpot_ms=1e6, window_s=60.0, cooldown_s=0.0)))
    long = SamplingParams(max_tokens=400, ignore_eos=True)
    with LLMEngine("qwen3-coder-tiny", EngineConfig(page_size=4, num_pages=256)) as engine:
        want = [o.output_ids for o in engine.generate(PROMPTS, long)]
    texts: dict[int, list[str]] = {}

    def stream(url: str, i: int) -> None:
        body = {"model": "qwen3-coder-tiny", "prompt": PROMPTS[i], "max_tokens": 400, "stream": True,
                "ignore_eos": True, "temperature": 0}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    texts.setdefault(i, []).append(json.loads(line[6:])["choices"][0]["text"])

    lines: list[str] = []
    with Cluster(spec).launch(port=0, on_progress=lines.append) as d:
        clients = [threading.Thread(target=stream, args=(d.url, i)) for i in range(len(PROMPTS))]
        for c in clients:
            c.start()
        result = d.bench(num_prompts=10, request_rate=float("inf"), input_len=16, output_len=4)  # fills the window
        assert result["failed"] == 0
        deadline = time.monotonic() + 30
        while not d.autoscale_decisions:
            assert time.monotonic() < deadline, "no decision"
            time.sleep(0.1)
        decision = d.autoscale_decisions[0]
        assert decision.applied and (decision.before, decision.after) == ("P1:D2", "P2:D1"), decision
        assert "prefill is short" in decision.reason and "calibrate" in decision.preview_note
        assert any(line == decision.line() for line in lines)
        assert decision.line() in d.metrics().notes  # under the live table
        for c in clients:
            c.join(120)
        assert ["".join(texts[i]) for i in range(len(PROMPTS))] == [d.backend.decode(w) for w in want]
        assert sorted(d.backend.unit_roles().values()) == ["decode", "prefill", "prefill"]
        text = httpx.get(f"{d.url}/metrics").text
        assert 'disaggsdk_autoscale_decisions_total{applied="true",change="P1:D2->P2:D1"' in text
