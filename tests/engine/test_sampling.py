"""Sampler: greedy, seeds, top-k / top-p support, logprobs, parameter checks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.sampling import SamplingError, SamplingParams, new_generator, sample  # noqa: E402


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
