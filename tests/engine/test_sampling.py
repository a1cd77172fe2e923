"""Sampler: greedy, seeds, top-k / top-p support, logprobs, parameter checks."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.sampling import new_generator, sample  # noqa: E402
from disaggsdk.engine.sampling_params import MAX_INT32, MAX_SEED, MIN_TEMPERATURE, SamplingError, SamplingParams  # noqa: E402  # noqa: E402


def test_greedy_and_logprobs():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    ids, lps = sample(logits, [SamplingParams(logprobs=2)], [new_generator(0, 0)])
    assert ids == [1]
    lp = logits.log_softmax(-1)[0]
    assert lps[0].logprob == pytest.approx(float(lp[1]))
    assert [t for t, _ in lps[0].top] == [1, 3]
    assert sample(logits, [SamplingParams()], [new_generator(0, 0)])[1] == [None]


def test_top_k_and_top_p_restrict_support_and_seed_repeats():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]]).repeat(1, 1)
    seen_k, seen_p = set(), set()
    for s in range(200):
        seen_k |= set(sample(logits, [SamplingParams(temperature=5.0, top_k=2)], [new_generator(s, 0)])[0])
        seen_p |= set(sample(logits, [SamplingParams(temperature=1.0, top_p=0.7)], [new_generator(s, 0)])[0])
    assert seen_k == {3, 4}
    # probs (softmax of 0..4): .64, .24, .09, ...; the smallest prefix reaching 0.7 is {4, 3}
    assert seen_p == {3, 4}
    p = SamplingParams(temperature=1.0, seed=7)
    draws = [sample(logits, [p], [new_generator(p.seed, 0)])[0][0] for _ in range(2)]
    many = [sample(logits, [p], [new_generator(s, 0)])[0][0] for s in range(50)]
    assert draws[0] == draws[1] and len(set(many)) > 2


def test_bad_params_name_the_field():
    with pytest.raises(SamplingError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(SamplingError, match="max_tokens"):
        SamplingParams(max_tokens=0)


# robustness: whatever the logits and whatever valid params, a valid token id and finite logprobs

VOCAB = 6
EXTREME_ROWS = [
    [1e30, -1e30, 0.0, 1e30, -1e30, 5.0],
    [float("inf"), 0.0, float("-inf"), 1.0, float("inf"), 2.0],
    [float("nan"), 1.0, float("nan"), 0.0, -1.0, 3.0],
    [float("-inf")] * VOCAB,
    [float("nan")] * VOCAB,
    [7.0] * VOCAB,
    [3e38, -3e38, 3e38, -3e38, 0.0, 1.0],
]
EXTREME_PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=MIN_TEMPERATURE),
    SamplingParams(temperature=1e4),
    SamplingParams(temperature=1.0, top_p=1e-9),
    SamplingParams(temperature=1.0, top_p=1.0, top_k=1),
    SamplingParams(temperature=MIN_TEMPERATURE, top_k=MAX_INT32, top_p=0.5),
    SamplingParams(temperature=1e4, top_k=VOCAB - 1, top_p=0.999999, logprobs=MAX_INT32),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_extreme_logits_never_raise_and_give_valid_ids(dtype):
    logits = torch.tensor(EXTREME_ROWS).to(dtype)
    for p in EXTREME_PARAMS:
        p = SamplingParams(**{**p.__dict__, "logprobs": p.logprobs if p.logprobs is not None else 2})
        for seed in range(5):
            ids, lps = sample(logits, [p] * len(EXTREME_ROWS), [new_generator(seed, 0) for _ in EXTREME_ROWS])
            assert all(0 <= t < VOCAB for t in ids), (p, ids)
            for lp in lps:
                assert math.isfinite(lp.logprob) and all(math.isfinite(v) for _, v in lp.top)


def test_extreme_logits_pick_the_sensible_token():
    logits = torch.tensor(EXTREME_ROWS)
    hot = SamplingParams(temperature=1e4)
    cold = SamplingParams(temperature=MIN_TEMPERATURE)
    for seed in range(20):
        ids, _ = sample(logits[:3], [cold] * 3, [new_generator(seed, 0) for _ in range(3)])
        assert ids[0] in (0, 3) and ids[1] in (0, 4) and ids[2] == 5  # NaN is never chosen
        ids, _ = sample(logits[1:3], [hot] * 2, [new_generator(seed, 0) for _ in range(2)])
        assert ids[0] in (0, 4) and ids[1] not in (0, 2)  # +inf keeps all the mass; NaN none
    assert sample(logits[1:3], [SamplingParams()] * 2, [new_generator(0, 0)] * 2)[0] == [0, 5]


def test_large_temperature_is_close_to_uniform_and_small_close_to_greedy():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    hot = {sample(logits, [SamplingParams(temperature=1e4)], [new_generator(s, 0)])[0][0] for s in range(100)}
    cold = {sample(logits, [SamplingParams(temperature=MIN_TEMPERATURE)], [new_generator(s, 0)])[0][0]
            for s in range(100)}
    assert hot == {0, 1, 2, 3} and cold == {3}


@pytest.mark.parametrize("field, value", [
    ("temperature", float("nan")), ("temperature", float("inf")), ("temperature", float("-inf")),
    ("temperature", 1e-40), ("temperature", 1e-45), ("temperature", MIN_TEMPERATURE / 2),
    ("temperature", -1.0), ("temperature", 10**400), ("temperature", "0.5"),
    ("top_p", float("nan")), ("top_p", float("inf")), ("top_p", 0.0), ("top_p", 1.5),
    ("max_tokens", 0), ("max_tokens", 2**31), ("max_tokens", 10**30), ("max_tokens", 1.5),
    ("top_k", -1), ("top_k", 2**31), ("seed", -1), ("seed", 2**63), ("seed", 2**200),
    ("logprobs", -1), ("logprobs", 2**40), ("stop_token_ids", (1, -2)), ("stop_token_ids", (2**40,)),
    ("ignore_eos", "yes"),
])
def test_bad_values_raise_a_sampling_error_naming_the_field(field, value):
    with pytest.raises(SamplingError, match=f"{field}="):
        SamplingParams(**{field: value})


def test_temperature_range_is_in_the_message_and_edges_are_accepted():
    with pytest.raises(SamplingError, match=r"0 \(greedy\) or >= 0.01"):
        SamplingParams(temperature=1e-40)
    for t in (0, 0.0, MIN_TEMPERATURE, 1e4, 2):
        SamplingParams(temperature=t)
    SamplingParams(max_tokens=MAX_INT32, seed=MAX_SEED, top_k=MAX_INT32, stop_token_ids=(0, MAX_INT32))


def test_a_request_stops_on_eos_a_stop_token_or_its_budget():
    from disaggsdk.engine.stopping import eos_token_ids, stop_reason

    eos = eos_token_ids({"eos_token_id": [2, 7]})
    assert eos == {2, 7} and eos_token_ids({"eos_token_id": 5}) == {5} and eos_token_ids({}) == frozenset()
    params = SamplingParams(max_tokens=3, stop_token_ids=[9])
    assert stop_reason(params, 1, 2, eos) == "stop"
    assert stop_reason(params, 1, 9, eos) == "stop"
    assert stop_reason(params, 1, 4, eos) is None
    assert stop_reason(params, 3, 4, eos) == "length"
    assert stop_reason(SamplingParams(max_tokens=3, ignore_eos=True), 1, 2, eos) is None
