"""The router against a fake `Runtime`: least-busy routing, events, unit deaths, stats (no processes)."""

from __future__ import annotations

import pytest

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import LaunchError, UnitDown
from disaggsdk.records.unit_counters import UnitCounters
from disaggsdk.serve.routing.router import Router
from disaggsdk.spec import Spec

PLAIN = SamplingParams()  # what a request without sampling options gets


class FakeRuntime:
    """Records what the router sends; the test plays the units' side through the listeners."""

    model_name = "fake"
    spec = Spec(model="qwen3-coder-tiny")  # the router reads serve.routing, kv.page_size, engine.num_pages

    def __init__(self, roles: dict[str, str]):
        self.roles = roles
        self.healthy = dict.fromkeys(roles, True)
        self.stalled: set[str] = set()  # alive (sends reach them) but unhealthy, as a started runtime's stalled units
        self.sent: list[tuple[str, object]] = []
        self.failures: list[str] = []
        self.closed = False
        self.state: dict[str, dict] = {}  # what each fake unit reports when asked for stats

    def unit_roles(self):
        return dict(self.roles)

    def is_healthy(self, unit):
        return self.healthy[unit] and unit not in self.stalled

    def may_recover(self, unit):
        return self.healthy[unit]  # this fake never restarts a unit

    def listen(self, on_message, on_unit_down):
        self.on_message, self.on_unit_down = on_message, on_unit_down

    def send(self, unit, message):
        if not self.healthy[unit]:
            return False
        self.sent.append((unit, message))
        if isinstance(message, ch.GetStats) and message.seq:  # answer at once, like a unit between steps
            self.on_message(unit, stats(unit, self.roles[unit], message.seq, **self.state.get(unit, {})))
        return True

    def close(self):
        self.closed = True

    def die(self, unit, collateral: bool = False):
        self.healthy[unit] = False
        self.on_unit_down(unit, UnitDown(f"unit {unit} died", collateral=collateral))


def stats(name: str, role: str, seq: int, used: int = 0, rejected_frames: dict | None = None) -> ch.UnitStats:
    return ch.UnitStats(seq=seq, name=name, role=role, running=0, waiting=0, num_free_pages=10 - used,
                        num_pages=10, counters=UnitCounters(rejected_frames=rejected_frames or {}), recent=[])


@pytest.fixture
def fake():
    rt = FakeRuntime({"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"})
    return rt, Router(rt)


def test_requests_go_to_the_least_busy_decode_unit_and_tokens_reach_their_sink(fake):
    rt, router = fake
    events = {}
    units = [router.submit(f"r{i}", [1, 2, 3], PLAIN, lambda ev: events.setdefault(ev.request_id, []).append(ev))
             for i in range(4)]
    assert units == ["decode-0", "decode-1", "decode-0", "decode-1"]  # never the prefill unit
    rt.on_message("decode-0", ch.Tokens("r0", [7, 8]))
    rt.on_message("decode-0", ch.Tokens("r0", [9], finished=True, finish_reason="length"))
    assert [t for ev in events["r0"] for t in ev.new_token_ids] == [7, 8, 9]
    assert events["r0"][-1].instance == "decode-0" and events["r0"][-1].finished
    assert router.submit("r4", [1], PLAIN, lambda ev: None) == "decode-0"  # r0 finished: decode-0 has fewer
    with pytest.raises(LaunchError, match="in flight"):
        router.submit("r1", [1], PLAIN, lambda ev: None)


def test_a_step_batch_of_tokens_reaches_each_request_in_order(fake):
    """One `TokensBatch` frame per engine step: every item goes to its own sink, and a finished
    item ends its request as a lone `Tokens` does."""
    rt, router = fake
    events = {}
    for rid in ("a", "b"):
        router.submit(rid, [1, 2], PLAIN, lambda ev: events.setdefault(ev.request_id, []).append(ev))
    rt.on_message("decode-0", ch.TokensBatch([ch.Tokens("a", [7])]))
    rt.on_message("decode-1", ch.TokensBatch([ch.Tokens("b", [5])]))
    rt.on_message("decode-0", ch.TokensBatch([ch.Tokens("a", [8], finished=True, finish_reason="length")]))
    rt.on_message("decode-1", ch.TokensBatch([ch.Tokens("b", [6]), ch.Tokens("zzz", [1])]))  # unknown: dropped
    assert [t for ev in events["a"] for t in ev.new_token_ids] == [7, 8] and events["a"][-1].finished
    assert [t for ev in events["b"] for t in ev.new_token_ids] == [5, 6] and not events["b"][-1].finished
    assert router.submit("c", [1], PLAIN, lambda ev: None) == "decode-0"  # a finished: decode-0 has fewer
    assert [r[0] for r in router.first_tokens.records()] == ["a", "b"]


def test_a_dead_unit_moves_requests_not_yet_streaming_and_ends_the_others_with_a_retryable_error(fake):
    rt, router = fake
    rt.on_message("decode-0", stats("decode-0", "decode", 0, used=4))
    assert next(s for s in router.stats() if s.name == "decode-0").kv_pages_used == 4
    waiting, streaming = [], []
    assert router.submit("waiting", [1, 2], PLAIN, waiting.append) == "decode-0"
    assert router.submit("streaming", [3], PLAIN, streaming.append) == "decode-1"
    assert router.submit("streaming-too", [3], PLAIN, streaming.append) == "decode-0"
    rt.on_message("decode-0", ch.Tokens("streaming-too", [5]))
    rt.die("decode-0")
    # not streaming yet: sent again, to the live unit, with its prompt; the client sees nothing
    assert rt.sent[-1][0] == "decode-1" and rt.sent[-1][1].request_id == "waiting"
    assert rt.sent[-1][1].prompt_ids == [1, 2] and waiting == []
    # already streaming: ends at once with an error that says to retry
    assert streaming[-1].finished and streaming[-1].finish_reason == "error" and "retry" in streaming[-1].error
    rt.on_message("decode-1", ch.Tokens("waiting", [7], finished=True, finish_reason="length"))
    assert [t for ev in waiting for t in ev.new_token_ids] == [7] and waiting[-1].instance == "decode-1"
    dead = next(s for s in router.stats() if s.name == "decode-0")
    assert not dead.healthy and dead.kv_pages_used == 0  # a dead unit's gauges go


def test_a_request_moves_only_once_and_not_when_no_unit_is_left(fake):
    rt, router = fake
    events = []
    router.submit("a", [1], PLAIN, events.append)  # decode-0
    rt.die("decode-0")
    assert events == [] and rt.sent[-1][0] == "decode-1"
    rt.die("decode-1")
    assert events[-1].finish_reason == "error"
    with pytest.raises(LaunchError, match="no decode unit is healthy"):
        router.submit("c", [2], PLAIN, lambda ev: None)  # not [1]: that one is poison now (two units died)
    assert "none can be restarted" in router.unrecoverable()


def test_unit_stats_gathers_every_healthy_unit_and_close_ends_what_is_in_flight(fake):
    rt, router = fake
    assert set(router.unit_stats()) == {"prefill-0", "decode-0", "decode-1"}
    events = []
    router.submit("x", [1], PLAIN, events.append)
    router.abort_sync("x")
    assert rt.sent[-1] == ("decode-0", ch.Abort("x"))
    router.close()
    assert rt.closed and events[-1].finish_reason == "error"
    with pytest.raises(LaunchError, match="closed"):
        router.submit("y", [1], PLAIN, lambda ev: None)


def test_rejected_frames_reach_metrics_by_reason(fake):
    from prometheus_client import generate_latest

    from disaggsdk.serve.metrics import ServerMetrics

    rt, router = fake
    rt.on_message("prefill-0", stats("prefill-0", "prefill", 0, rejected_frames={"replayed": 2, "BadMac": 1}))
    assert next(s for s in router.stats() if s.name == "prefill-0").counters.rejected_frames == {"replayed": 2, "BadMac": 1}
    rt.state["prefill-0"] = {"rejected_frames": {"replayed": 2, "BadMac": 1}}
    text = generate_latest(ServerMetrics(router.stats, "fake").registry).decode()
    assert ('disaggsdk_control_frames_rejected_total{engine="prefill-0",model_name="fake",reason="replayed",'
            'role="prefill"} 2.0') in text


def test_a_scrape_shows_the_units_now_not_the_scrape_before(fake):
    from prometheus_client import generate_latest

    from disaggsdk.serve.metrics import ServerMetrics

    rt, router = fake
    metrics = ServerMetrics(router.stats, "fake")
    line = 'disaggsdk_kv_pages_used{engine="decode-1",model_name="fake",role="decode"}'
    rt.state["decode-1"] = {"used": 3}
    assert f"{line} 3.0" in generate_latest(metrics.registry).decode()
    rt.state["decode-1"] = {"used": 7}  # the units change between two scrapes
    assert f"{line} 7.0" in generate_latest(metrics.registry).decode()
    assert next(s for s in router.stats() if s.name == "decode-1").kv_pages_used == 7


def test_a_request_two_units_died_holding_is_never_sent_again_nor_one_like_it(fake):
    """The probe's poison (issue 33): a request that takes down the unit it waits on, then the one it
    moved to, ends with an error that says why; it is not sent a third time, and an identical
    request under another id is refused before any unit sees it. A different request still goes."""
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.serve.routing.poison_requests import RefusedRequestError

    rt, router = fake
    params = SamplingParams(max_tokens=4, seed=3)
    events = []
    assert router.submit("poison", [1, 2, 3], params, events.append) == "decode-0"
    rt.die("decode-0")
    assert events == [] and rt.sent[-1][0] == "decode-1"  # the first death may be bad luck: moved once
    rt.healthy["decode-0"] = True  # restarted meanwhile
    rt.die("decode-1")
    assert events[-1].finished and events[-1].finish_reason == "error" and "2 units died" in events[-1].error
    generates = [m for _, m in rt.sent if isinstance(m, ch.Generate)]
    assert [m.request_id for m in generates] == ["poison", "poison"]  # never a third time
    rt.healthy["decode-1"] = True
    with pytest.raises(RefusedRequestError, match="2 units died"):
        router.submit("poison-again", [1, 2, 3], SamplingParams(max_tokens=4, seed=3), events.append)
    assert len([m for _, m in rt.sent if isinstance(m, ch.Generate)]) == 2
    assert "poison-again" not in router._requests  # nothing of it stays in flight
    router.submit("other-seed", [1, 2, 3], SamplingParams(max_tokens=4, seed=4), events.append)
    assert rt.sent[-1][1].request_id == "other-seed"


def test_a_unit_stopped_with_its_lock_step_group_counts_no_death_against_what_it_held(fake):
    """Issue 36: when one rank of a lock-step dp group dies the runtime stops the others (collateral);
    their waiting requests move on as after any death, but are not suspected of having killed them."""
    rt, router = fake
    events = []
    assert router.submit("innocent", [1, 2, 3], PLAIN, events.append) == "decode-0"
    rt.die("decode-0", collateral=True)
    assert events == [] and rt.sent[-1][0] == "decode-1"
    rt.healthy["decode-0"] = True
    rt.die("decode-1", collateral=True)
    assert events and "retry the request" in events[-1].error  # moved once already: ended, not refused as poison
    rt.healthy["decode-1"] = True
    router.submit("innocent-again", [1, 2, 3], PLAIN, events.append)  # an identical request is still sent
    assert rt.sent[-1][1].request_id == "innocent-again"


def test_a_request_that_was_streaming_counts_no_death_against_its_fingerprint(fake):
    rt, router = fake
    events = []
    for attempt in range(3):  # a unit dies under the same streaming request three times: bad luck
        rid = f"s{attempt}"
        unit = router.submit(rid, [4, 5], PLAIN, events.append)
        rt.on_message(unit, ch.Tokens(rid, [7]))
        rt.die(unit)
        rt.healthy[unit] = True
        assert events[-1].finish_reason == "error" and "retry the request" in events[-1].error


def _one_waiting_and_one_streaming_on_decode_0(rt, router):
    """Requests "w" (no token yet) and "s" (one token streamed) on decode-0, "other" on decode-1;
    returns the events of "w" and of "s"."""
    waiting, streaming = [], []
    assert router.submit("w", [1, 2], PLAIN, waiting.append) == "decode-0"
    assert router.submit("other", [5], PLAIN, lambda ev: None) == "decode-1"
    assert router.submit("s", [3], PLAIN, streaming.append) == "decode-0"
    rt.on_message("decode-0", ch.Tokens("s", [9]))
    return waiting, streaming


def test_a_stalled_unit_loses_its_waiting_requests_once_and_its_late_answers_are_dropped(fake):
    from disaggsdk.launch.base import UnitStalled

    rt, router = fake
    waiting, streaming = _one_waiting_and_one_streaming_on_decode_0(rt, router)
    rt.stalled.add("decode-0")  # the runtime reads a stalled unit unhealthy, then tells the router
    rt.on_message("decode-0", UnitStalled(10.0))
    assert ("decode-1", ch.Generate("w", [1, 2], PLAIN)) in rt.sent and ("decode-0", ch.Abort("w")) in rt.sent
    assert not any(isinstance(m, ch.Abort) and m.request_id == "s" for _, m in rt.sent)  # streaming: stays
    assert router.submit("new", [8], PLAIN, lambda ev: None) == "decode-1"  # never the stalled unit
    rt.stalled.discard("decode-0")  # it wakes: its answer to the abort, and any token for "w", are not w's
    rt.on_message("decode-0", ch.Tokens("w", [], True, "abort"))
    assert waiting == []
    rt.on_message("decode-1", ch.Tokens("w", [6], True, "length"))
    assert [t for ev in waiting for t in ev.new_token_ids] == [6] and waiting[-1].instance == "decode-1"
    rt.on_message("decode-0", ch.Tokens("s", [10], True, "length"))
    assert [t for ev in streaming for t in ev.new_token_ids] == [9, 10]


def test_an_unreachable_unit_loses_every_request_it_held_and_each_gets_an_abort_for_the_heal(fake):
    """Waiting requests move once; streaming ones end with an error that says to retry (their tokens
    cannot reach the client); every one gets an abort, which the unit reads once it is reached again."""
    from disaggsdk.launch.base import UnitUnreachable

    rt, router = fake
    waiting, streaming = _one_waiting_and_one_streaming_on_decode_0(rt, router)
    rt.stalled.add("decode-0")  # the runtime reads an unreachable unit unhealthy, then tells the router
    rt.on_message("decode-0", UnitUnreachable(10.0))
    assert ("decode-1", ch.Generate("w", [1, 2], PLAIN)) in rt.sent
    assert ("decode-0", ch.Abort("w")) in rt.sent and ("decode-0", ch.Abort("s")) in rt.sent
    assert streaming[-1].finished and streaming[-1].finish_reason == "error"
    assert "decode-0 is unreachable" in streaming[-1].error and "retry the request" in streaming[-1].error
    assert router.submit("new", [8], PLAIN, lambda ev: None) == "decode-1"
    rt.stalled.discard("decode-0")  # the link heals: what it sends for either request is theirs no more
    rt.on_message("decode-0", ch.Tokens("s", [10], True, "length"))
    rt.on_message("decode-0", ch.Tokens("w", [], True, "abort"))
    assert [t for ev in streaming for t in ev.new_token_ids] == [9] and len(streaming) == 2
    assert waiting == []
    rt.on_message("decode-1", ch.Tokens("w", [6], True, "length"))
    assert [t for ev in waiting for t in ev.new_token_ids] == [6] and waiting[-1].instance == "decode-1"


def test_a_request_on_an_unreachable_unit_with_nowhere_to_move_ends_with_a_retryable_error():
    from disaggsdk.launch.base import UnitUnreachable

    rt = FakeRuntime({"prefill-0": "prefill", "decode-0": "decode"})
    router = Router(rt)
    events = []
    router.submit("w", [1, 2], PLAIN, events.append)
    rt.stalled.add("decode-0")
    rt.on_message("decode-0", UnitUnreachable(3.0))
    assert events[-1].finish_reason == "error" and "unreachable" in events[-1].error
    assert ("decode-0", ch.Abort("w")) in rt.sent
    with pytest.raises(LaunchError, match="no decode unit is healthy"):
        router.submit("next", [1], PLAIN, lambda ev: None)


def test_one_client_cannot_keep_spending_restarts_with_ever_new_poison(fake):
    """A client that varies its poison (issue 33): its first poison request costs two unit deaths, the
    next one a single death (never moved), then its requests are refused; other clients are served."""
    from disaggsdk.engine.sampling_params import SamplingParams
    from disaggsdk.serve.routing.poison_requests import RefusedRequestError

    rt, router = fake
    events = []

    def revive():
        rt.healthy.update(dict.fromkeys(rt.healthy, True))

    unit = router.submit("p1", [1, 2, 3], SamplingParams(seed=1), events.append, client="198.18.0.5")
    rt.die(unit)
    rt.die(rt.sent[-1][0])  # it moved once; its second unit dies too: poison
    assert events[-1].request_id == "p1" and events[-1].finish_reason == "error"
    revive()
    unit = router.submit("p2", [9, 9, 9], SamplingParams(seed=2), events.append, client="198.18.0.5")
    rt.die(unit)
    assert events[-1].request_id == "p2" and "1 unit died" in events[-1].error  # not moved this time
    revive()
    deaths = len([m for _, m in rt.sent if isinstance(m, ch.Generate)])
    assert deaths == 3
    with pytest.raises(RefusedRequestError, match="requests from 198.18.0.5 are refused"):
        router.submit("p3", [5, 6], SamplingParams(seed=3), events.append, client="198.18.0.5")
    router.submit("fine", [5, 6], SamplingParams(seed=3), events.append, client="198.18.0.6")
    router.submit("in-process", [5, 6], SamplingParams(seed=4), events.append)
    assert [m.request_id for _, m in rt.sent if isinstance(m, ch.Generate)][deaths:] == ["fine", "in-process"]
