"""Decoding requests moved between decode units with their KV (real processes, real libfabric):
they continue exactly (GQA; MLA with MTP drafting; a grammar; a seeded sample), the bytes moved are
the pages' bytes (nothing recomputed), a drained unit ends up holding nothing, and killing either
side in the middle of a move leaves each request finished with the right tokens or failed with a
clear error, and no page or grant key behind on the units that live."""

from __future__ import annotations

import threading
import time

import attrs
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("llguidance")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.speculative.config import SpeculativeConfig  # noqa: E402
from disaggsdk.engine.structured.output import StructuredOutput  # noqa: E402
from disaggsdk.serve.backends.local import serve_locally  # noqa: E402
from disaggsdk.serve.moves.request_moves import MoveError  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402

PAGE_SIZE = 4
NUM_PAGES = 256
MAX_TOKENS = 120  # long enough that a move lands mid-decode on these tiny models
PROMPTS = [[(7 * i + 3 * j) % 250 + 1 for j in range(n)] for i, n in enumerate((9, 23, 14))]


class Stream:
    """One request's events as a sink collects them (on the router's reader thread)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.done = threading.Event()

    def __call__(self, ev) -> None:
        self.tokens += ev.new_token_ids
        if ev.finished:
            self.finish_reason, self.error = ev.finish_reason, ev.error
            self.done.set()

    def wait_tokens(self, n: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.tokens) < n and not self.done.is_set():
            assert time.monotonic() < deadline, f"only {len(self.tokens)} tokens after {timeout_s} s"
            time.sleep(0.002)


def spec_for(model: str, method: str = "none", provider: str = "shm"):
    spec = make_spec(model, decode_replicas=2, provider=provider, num_pages=NUM_PAGES, page_size=PAGE_SIZE,
                     budget=64, deadline_s=10.0)
    return attrs.evolve(spec, speculative=attrs.evolve(spec.speculative, method=method))


def reference(model: str, params: list[SamplingParams], method: str = "none") -> list[list[int]]:
    """The unmoved run: the colocated engine (disaggregated tokens equal it: test_disagg_parity)."""
    spec = SpeculativeConfig(method, 1) if method != "none" else None
    config = EngineConfig(page_size=PAGE_SIZE, num_pages=NUM_PAGES, max_num_batched_tokens=64, speculative=spec)
    with LLMEngine(model, config) as engine:
        return [o.output_ids for o in engine.generate(PROMPTS, params)]


def kv_page_bytes(model: str, method: str) -> int:
    """Bytes of one page of every cache layer of one rank (the MTP layer's included)."""
    spec = SpeculativeConfig(method, 1) if method != "none" else None
    with LLMEngine(model, EngineConfig(page_size=PAGE_SIZE, num_pages=8, speculative=spec)) as engine:
        return engine.kv.cache.fmt.num_layers * engine.kv.cache.fmt.page_bytes


def unit_of(rt, rid: str) -> str:
    unit = rt.unit_of(rid)
    assert unit is not None, f"{rid} is not in flight"
    return unit


def assert_nothing_held(rt) -> None:
    stats = rt.unit_stats()
    assert all(s.num_free_pages == s.num_pages for s in stats.values()), {n: s.num_free_pages for n, s in stats.items()}
    assert all(s.open_grant_keys == 0 for s in stats.values()), {n: s.open_grant_keys for n, s in stats.items()}
    assert all(s.open_counters == 0 for s in stats.values()), {n: s.open_counters for n, s in stats.items()}


# The default run keeps MLA with MTP and a grammar (every piece of state a move carries); GQA moves run in
# the drain, kill and role-change tests too; `make test-all` runs all three here.
CASES = [
    pytest.param("qwen3-coder-tiny", "none", False, id="gqa", marks=pytest.mark.slow),
    pytest.param("deepseek-r1-tiny", "mtp", False, id="mla-mtp", marks=pytest.mark.slow),
    pytest.param("deepseek-r1-tiny", "mtp", True, id="mla-mtp-grammar"),
]


@pytest.mark.parametrize("model,method,grammar", CASES)
def test_moved_requests_continue_exactly_and_move_their_pages_bytes(model, method, grammar):
    if grammar:
        params = [SamplingParams(max_tokens=MAX_TOKENS, structured=StructuredOutput("regex", r"[a-z]{3,8}_[0-9]{2,200}"))
                  for _ in PROMPTS]
    else:  # greedy, and one seeded sample: its generator's state moves too
        params = [SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.8 if i == 1 else 0.0,
                                 seed=5 if i == 1 else None) for i in range(len(PROMPTS))]
    want = reference(model, params, method)
    page_bytes = kv_page_bytes(model, method)
    before = live_descendants()
    with serve_locally(spec_for(model, method), on_event=lambda _l: None) as rt:
        streams = [Stream() for _ in PROMPTS]
        rids = [f"m{i}" for i in range(len(PROMPTS))]
        for rid, prompt, p, s in zip(rids, PROMPTS, params, streams):
            rt.submit(rid, prompt, p, s)
        outcomes = []
        for rid, prompt, s in zip(rids, PROMPTS, streams):
            s.wait_tokens(3)
            source = unit_of(rt, rid)
            target = "decode-1" if source == "decode-0" else "decode-0"
            outcome = rt.move(rid, target).result(timeout=30)
            assert outcome.moved, outcome.reason
            assert unit_of(rt, rid) == target
            # every page of its computed KV, of every layer (MTP's included), and nothing else
            num_pages = -(-(len(prompt) + outcome.num_output_tokens - 1) // PAGE_SIZE)
            assert outcome.num_bytes == num_pages * page_bytes
            outcomes.append(outcome)
        # the first one goes back where it came from: a request moves as often as asked
        back = rt.move(rids[0], outcomes[0].source).result(timeout=30)
        for s in streams:
            assert s.done.wait(60)
        got = [s.tokens for s in streams]
        assert all(s.finish_reason in (("stop", "length") if grammar else ("length",)) for s in streams)
        assert got == want
        stats = rt.unit_stats()
        moved_in = sum(s.counters.requests_moved_in for s in stats.values())
        assert moved_in == len(PROMPTS) + back.moved
        assert (sum(s.counters.moved_in_bytes for s in stats.values())
                == sum(s.counters.moved_out_bytes for s in stats.values())
                == sum(o.num_bytes for o in [*outcomes, back]))
        assert sum(s.counters.prefilled_locally for s in stats.values()) == 0  # nothing recomputed
        assert_nothing_held(rt)
    assert live_descendants() <= before


def test_a_move_that_cannot_be_asked_for_is_refused_with_what_to_fix():
    with serve_locally(spec_for("qwen3-coder-tiny"), on_event=lambda _l: None) as rt:
        s = Stream()
        rt.submit("r", PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), s)
        s.wait_tokens(1)
        source = unit_of(rt, "r")
        with pytest.raises(MoveError, match="not another healthy decode unit"):
            rt.move("r", "prefill-0")
        with pytest.raises(MoveError, match="not another healthy decode unit"):
            rt.move("r", source)
        with pytest.raises(MoveError, match="not in flight"):
            rt.move("nobody", "decode-1")
        assert s.done.wait(60) and s.finish_reason == "length"


def test_drain_moves_every_request_away_and_routing_skips_the_unit():
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    want = reference("qwen3-coder-tiny", [params] * len(PROMPTS))
    with serve_locally(spec_for("qwen3-coder-tiny"), on_event=lambda _l: None) as rt:
        streams = [Stream() for _ in PROMPTS]
        for i, (prompt, s) in enumerate(zip(PROMPTS, streams)):
            rt.submit(f"d{i}", prompt, params, s)
        for s in streams:
            s.wait_tokens(2)
        report = rt.drain("decode-0", timeout_s=30)
        assert report.drained and report.moves and all(o.moved for o in report.moves), report
        assert rt.num_in_flight("decode-0") == 0
        late = Stream()
        assert rt.submit("late", PROMPTS[0], params, late) == "decode-1"  # a drained unit takes nothing new
        for s in [*streams, late]:
            assert s.done.wait(60)
        assert [s.tokens for s in streams] == want and late.tokens == want[0]
        rt.undrain("decode-0")
        assert_nothing_held(rt)


@pytest.mark.parametrize("victim", ["source", "target"])
def test_killing_either_side_mid_move_finishes_or_fails_each_request_clearly_and_leaks_nothing(victim):
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    want = reference("qwen3-coder-tiny", [params] * len(PROMPTS))
    before = live_descendants()
    # tcp: a SIGKILLed shm peer can wedge its peers (test_lifecycle.py); grant keys are on over tcp
    with serve_locally(spec_for("qwen3-coder-tiny", provider="tcp"), on_event=lambda _l: None, max_restarts=1) as rt:
        streams = [Stream() for _ in PROMPTS]
        rids = [f"k{i}" for i in range(len(PROMPTS))]
        for rid, prompt, s in zip(rids, PROMPTS, streams):
            rt.submit(rid, prompt, params, s)
        for s in streams:
            s.wait_tokens(2)
        source = unit_of(rt, rids[0])
        target = "decode-1" if source == "decode-0" else "decode-0"
        moving = [rid for rid in rids if unit_of(rt, rid) == source]
        futures = [rt.move(rid, target) for rid in moving]
        rt.runtime.kill_unit(source if victim == "source" else target)  # while the moves are under way
        for f in futures:
            f.result(timeout=60)
        for rid, s, w in zip(rids, streams, want):
            assert s.done.wait(60), rid
            if s.finish_reason == "error":
                assert "died" in s.error and "retry" in s.error, s.error
            else:
                assert s.tokens == w, rid
        if victim == "target":  # the source never let go of their KV: every moving request finished
            moved = [s for rid, s in zip(rids, streams) if rid in moving]
            assert all(s.finish_reason == "length" for s in moved), [s.error for s in moved]
        # the survivors, and the victim once restarted, hold nothing
        deadline = time.monotonic() + 60
        while not all(u.healthy for u in rt.runtime.units.values()):
            assert time.monotonic() < deadline, "the killed unit did not come back"
            time.sleep(0.1)
        time.sleep(1.5)  # quarantined grants free after the dead peer's grace
        assert_nothing_held(rt)
    assert live_descendants() <= before
