"""Poison fingerprints: what makes two requests the same, how long deaths are remembered, how many."""

from __future__ import annotations

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.serve.routing.poison_requests import PoisonRequests, fingerprint


def test_same_prompt_and_parameters_are_the_same_request_whatever_else_differs():
    a = fingerprint([1, 2, 3], SamplingParams(max_tokens=4, seed=1))
    assert a == fingerprint((1, 2, 3), SamplingParams(max_tokens=4, seed=1))
    assert a != fingerprint([1, 2, 3], SamplingParams(max_tokens=4, seed=2))
    assert a != fingerprint([1, 2, 4], SamplingParams(max_tokens=4, seed=1))
    assert fingerprint([2**70], None) is None  # not encodable: the send refuses it, nothing to remember


def test_deaths_are_counted_per_fingerprint_and_forgotten_after_memory_s():
    poison = PoisonRequests(max_unit_deaths=2, memory_s=100.0)
    assert poison.unit_died_holding(b"p", now_s=0.0) == 1 and not poison.is_poison(b"p", now_s=1.0)
    assert poison.unit_died_holding(b"p", now_s=50.0) == 2 and poison.is_poison(b"p", now_s=51.0)
    assert not poison.is_poison(b"q", now_s=51.0) and not poison.is_poison(None, now_s=51.0)
    assert not poison.is_poison(b"p", now_s=151.0)  # 100 s after the last death
    assert poison.unit_died_holding(b"p", now_s=152.0) == 1


def test_the_oldest_fingerprints_go_past_capacity():
    poison = PoisonRequests(max_unit_deaths=1, capacity=3)
    for i in range(5):
        poison.unit_died_holding(bytes([i]), now_s=float(i))
    assert [poison.is_poison(bytes([i]), now_s=5.0) for i in range(5)] == [False, False, True, True, True]


def test_clients_are_counted_by_their_poison_requests_and_forgiven_after_the_memory():
    poison = PoisonRequests(memory_s=100.0, max_poison_per_client=2)
    assert poison.sent_poison("", now_s=0.0) == 0 and poison.client_refusal("", now_s=0.0) is None  # in-process
    assert poison.sent_poison("198.18.0.5", now_s=0.0) == 1 and poison.client_refusal("198.18.0.5", 1.0) is None
    assert poison.sent_poison("198.18.0.5", now_s=50.0) == 2
    assert "198.18.0.5 are refused" in poison.client_refusal("198.18.0.5", now_s=149.0)
    assert poison.client_refusal("198.18.0.6", now_s=149.0) is None
    assert poison.client_refusal("198.18.0.5", now_s=151.0) is None and poison.poison_sent_by("198.18.0.5", 151.0) == 0
