"""The router's side of moving a decoding request between decode units, against a fake runtime:
every ordering of the two units' messages delivers each token once and in order, and a unit that
dies in the middle leaves the request going on where its KV is whole, or ended with a clear error."""

from __future__ import annotations

import pytest

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.launch import messages as ch
from disaggsdk.serve.moves.request_moves import MoveError
from disaggsdk.serve.routing.router import Router
from tests.serve.test_router import FakeRuntime

PLAIN = SamplingParams()


@pytest.fixture
def started():
    """A request streaming on decode-0 (tokens 1, 2 so far) and a router to move it."""
    rt = FakeRuntime({"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"})
    router = Router(rt)
    events = []
    assert router.submit("r", [5, 6, 7], PLAIN, events.append) == "decode-0"
    rt.on_message("decode-0", ch.Tokens("r", [1, 2]))
    return rt, router, events


def tokens(events) -> list[int]:
    return [t for ev in events for t in ev.new_token_ids]


def test_the_targets_tokens_wait_for_the_sources_last_ones(started):
    rt, router, events = started
    outcome = router.move("r", "decode-1")
    assert rt.sent[-1] == ("decode-0", ch.MoveRequest("r", "decode-1"))
    # the target's news and first tokens are read before the source's last token and its end
    rt.on_message("decode-1", ch.RequestMovedIn("r", "decode-0", num_output_tokens=3, num_bytes=4096))
    rt.on_message("decode-1", ch.Tokens("r", [4, 5]))
    rt.on_message("decode-0", ch.Tokens("r", [3]))
    assert tokens(events) == [1, 2, 3]
    rt.on_message("decode-0", ch.RequestMoveEnded("r", "decode-1", moved=True))
    assert tokens(events) == [1, 2, 3, 4, 5] and events[-1].instance == "decode-1"
    assert outcome.result(0).moved and outcome.result(0).num_bytes == 4096
    rt.on_message("decode-0", ch.Tokens("r", [99]))  # the source holds it no more: dropped
    rt.on_message("decode-1", ch.Tokens("r", [6], finished=True, finish_reason="length"))
    assert tokens(events) == [1, 2, 3, 4, 5, 6] and events[-1].finished
    router.abort_sync("r")  # finished: nobody is asked


def test_the_sources_end_read_before_the_targets_news_still_moves_the_request(started):
    rt, router, events = started
    outcome = router.move("r", "decode-1")
    rt.on_message("decode-0", ch.RequestMoveEnded("r", "decode-1", moved=True))  # its channel was read first
    assert not outcome.done() and ("decode-1", ch.Abort("r")) not in rt.sent
    rt.die("decode-0")  # the source is done with it: its death changes nothing
    rt.on_message("decode-1", ch.RequestMovedIn("r", "decode-0", 2, 4096))
    assert outcome.result(0).moved and not [u for u, m in rt.sent if isinstance(m, ch.Abort)]
    rt.on_message("decode-1", ch.Tokens("r", [3], finished=True, finish_reason="length"))
    assert tokens(events) == [1, 2, 3] and events[-1].finish_reason == "length"


def test_the_target_dying_between_the_sources_end_and_its_news_ends_the_request(started):
    rt, router, events = started
    outcome = router.move("r", "decode-1")
    rt.on_message("decode-0", ch.RequestMoveEnded("r", "decode-1", moved=True))
    rt.die("decode-1")
    assert not outcome.result(0).moved and events[-1].finish_reason == "error" and "retry" in events[-1].error


def test_a_move_that_did_not_happen_drops_what_the_target_sent_and_goes_on_at_the_source(started):
    rt, router, events = started
    outcome = router.move("r", "decode-1")
    rt.on_message("decode-1", ch.RequestMovedIn("r", "decode-0", 2, 4096))
    rt.on_message("decode-1", ch.Tokens("r", [3]))  # admitted there before the source gave up on it
    rt.on_message("decode-0", ch.RequestMoveEnded("r", "decode-1", moved=False, reason="no admission in time"))
    assert not outcome.result(0).moved and "admission" in outcome.result(0).reason
    rt.on_message("decode-0", ch.Tokens("r", [3], finished=True, finish_reason="length"))
    assert tokens(events) == [1, 2, 3] and events[-1].finished


def test_the_source_dying_after_the_target_had_the_kv_leaves_the_request_going_on_there(started):
    rt, router, events = started
    outcome = router.move("r", "decode-1")
    rt.on_message("decode-1", ch.RequestMovedIn("r", "decode-0", 2, 4096))
    rt.on_message("decode-1", ch.Tokens("r", [3]))
    rt.die("decode-0")
    assert outcome.result(0).moved and tokens(events) == [1, 2, 3] and not events[-1].finished
    rt.on_message("decode-1", ch.Tokens("r", [4], finished=True, finish_reason="length"))
    assert tokens(events) == [1, 2, 3, 4] and events[-1].finish_reason == "length"


def test_the_source_dying_before_the_target_had_the_kv_ends_the_request_and_tells_the_target(started):
    rt, router, events = started
    outcome = router.move("r", "decode-1")
    rt.die("decode-0")
    assert events[-1].finish_reason == "error" and "died" in events[-1].error and "retry" in events[-1].error
    assert ("decode-1", ch.Abort("r")) in rt.sent  # the grant it may hold for it goes
    assert not outcome.result(0).moved
    rt.on_message("decode-1", ch.RequestMovedIn("r", "decode-0", 2, 4096))  # too late: dropped again
    assert rt.sent[-1] == ("decode-1", ch.Abort("r"))


def test_the_target_dying_leaves_the_request_with_the_source(started):
    rt, router, events = started
    outcome = router.move("r", "decode-1")
    rt.on_message("decode-1", ch.RequestMovedIn("r", "decode-0", 2, 4096))
    rt.on_message("decode-1", ch.Tokens("r", [3]))  # held, then dropped with the target
    rt.die("decode-1")
    rt.on_message("decode-0", ch.RequestMoveEnded("r", "decode-1", moved=False, reason="target unit decode-1 went down"))
    assert not outcome.result(0).moved
    rt.on_message("decode-0", ch.Tokens("r", [3], finished=True, finish_reason="length"))
    assert tokens(events) == [1, 2, 3] and events[-1].finish_reason == "length"


def test_the_target_dying_after_the_source_let_go_ends_the_request_clearly(started):
    rt, router, events = started
    outcome = router.move("r", "decode-1")
    rt.on_message("decode-1", ch.RequestMovedIn("r", "decode-0", 2, 4096))
    rt.die("decode-1")
    rt.on_message("decode-0", ch.RequestMoveEnded("r", "decode-1", moved=True))
    assert not outcome.result(0).moved
    assert events[-1].finish_reason == "error" and "decode-1" in events[-1].error and "retry" in events[-1].error


def test_an_abort_while_moving_reaches_both_units(started):
    rt, router, events = started
    router.move("r", "decode-1")
    router.abort_sync("r")
    assert ("decode-0", ch.Abort("r")) in rt.sent and ("decode-1", ch.Abort("r")) in rt.sent


def test_moves_that_cannot_be_asked_for(started):
    rt, router, events = started
    router.submit("new", [1, 2], PLAIN, lambda ev: None)
    with pytest.raises(MoveError, match="has not started decoding"):
        router.move("new", "decode-0")
    with pytest.raises(MoveError, match="not another healthy decode unit"):
        router.move("r", "prefill-0")
    router.move("r", "decode-1")
    with pytest.raises(MoveError, match="moving already"):
        router.move("r", "decode-1")
    rt.die("prefill-0")
    rt.die("decode-1")
    rt.on_message("decode-0", ch.RequestMoveEnded("r", "decode-1", moved=False, reason="target unit decode-1 went down"))
    with pytest.raises(MoveError, match="not another healthy decode unit"):
        router.move("r", "decode-1")


def test_requests_waiting_for_a_first_token_are_counted_by_age(started):
    rt, router, events = started
    import time

    before = time.monotonic()
    router.submit("q", [1, 2], PLAIN, lambda ev: None)
    time.sleep(0.02)
    assert router.num_waiting_past(0.01) == 1  # "r" has its first tokens: not waiting
    assert router.num_waiting_past(60) == 0 and router.num_waiting_past(0.01, since_s=time.monotonic()) == 0
    assert router.num_waiting_past(0.01, since_s=before) == 1
    rt.on_message("decode-1", ch.Tokens("q", [4]))
    assert router.num_waiting_past(0.0) == 0
