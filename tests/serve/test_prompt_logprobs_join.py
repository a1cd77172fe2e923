"""The router's join of prompt scores (from whichever unit computed the prompt) with the decode
unit's token events: held until the scores come, in either order; the first event carries them."""

from __future__ import annotations

from disaggsdk.engine.sampling_params import SamplingParams, TokenLogprobs
from disaggsdk.serve.backend import TokenEvent
from disaggsdk.serve.routing.prompt_logprobs_join import PromptLogprobsJoin

SCORES = [None, TokenLogprobs(7, -1.5)]
ASKS = SamplingParams(prompt_logprobs=0)


def test_events_wait_for_scores_that_come_late():
    join = PromptLogprobsJoin()
    join.expect("r", ASKS)
    assert join.event(TokenEvent("r", [1])) == []
    assert join.event(TokenEvent("r", [2], True, "length")) == []
    out = join.scores("r", SCORES)
    assert [e.new_token_ids for e in out] == [[1], [2]]
    assert out[0].prompt_logprobs == SCORES and out[1].prompt_logprobs is None
    assert join.scores("r", SCORES) == []  # a retried prefill's duplicate drops


def test_scores_that_come_first_go_on_the_first_event():
    join = PromptLogprobsJoin()
    join.expect("r", ASKS)
    assert join.scores("r", SCORES) == []
    (event,) = join.event(TokenEvent("r", [1]))
    assert event.prompt_logprobs == SCORES
    assert join.event(TokenEvent("r", [2])) == [TokenEvent("r", [2])]


def test_scores_on_a_decode_units_own_event_are_moved_to_the_first():
    join = PromptLogprobsJoin()
    join.expect("r", ASKS)
    join.event(TokenEvent("r", [1]))
    out = join.event(TokenEvent("r", [2], prompt_logprobs=SCORES))  # it prefilled locally
    assert out[0].prompt_logprobs == SCORES and out[1].prompt_logprobs is None


def test_an_error_ends_the_wait_and_requests_without_scores_pass():
    join = PromptLogprobsJoin()
    join.expect("r", ASKS)
    join.expect("plain", SamplingParams())
    assert join.event(TokenEvent("plain", [3])) == [TokenEvent("plain", [3])]
    out = join.event(TokenEvent("r", [], True, "error", error="unit died"))
    assert out[0].finish_reason == "error"
    join.expect("gone", ASKS)
    join.forget("gone")
    assert join.event(TokenEvent("gone", [1])) == [TokenEvent("gone", [1])]
