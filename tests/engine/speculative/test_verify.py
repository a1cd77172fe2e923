"""Verifying drafts: greedy acceptance equals plain greedy decoding; rejection sampling keeps the
target's distribution (checked statistically on a small known distribution)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.speculative.stats import SpecStats  # noqa: E402
from disaggsdk.engine.speculative.verify import verify_drafts  # noqa: E402


def test_greedy_accepts_the_argmax_prefix_then_gives_the_target_token():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0], [1.0, 2.0, 0.0]])
    greedy = SamplingParams(logprobs=1)
    v = verify_drafts(logits, [1, 0, 2], greedy, None)  # every draft is the argmax: all kept, plus a bonus
    assert (v.token_ids, v.num_accepted) == ([1, 0, 2, 1], 3)
    v = verify_drafts(logits, [1, 2, 2], greedy, None)  # the second draft is not row 1's argmax (0)
    assert (v.token_ids, v.num_accepted) == ([1, 0], 1)
    assert [lp.token_id for lp in v.logprobs] == [1, 0] and v.logprobs[1].top[0][0] == 0
    assert verify_drafts(logits[:1], [], greedy, None).token_ids == [1]  # no drafts: plain greedy


TARGET = torch.tensor([0.5, 0.3, 0.15, 0.05])  # the target's next-token distribution
SAMPLES = 20_000


@pytest.mark.parametrize("draft", [0, 1, 3], ids=["likely-draft", "middle-draft", "unlikely-draft"])
def test_rejection_sampling_keeps_the_target_distribution(draft):
    """Whatever the (one-hot) draft, the first emitted token is distributed as the target: the
    frequencies over 20,000 draws match within 4.5 standard errors (a false alarm ~1 in 10^5)."""
    logits = TARGET.log().repeat(2, 1)  # row 0 verifies the draft, row 1 is the bonus row
    params = SamplingParams(temperature=1.0)
    gen = torch.Generator().manual_seed(draft)
    counts = torch.zeros(4)
    accepted = 0
    for _ in range(SAMPLES):
        v = verify_drafts(logits, [draft], params, gen)
        counts[v.token_ids[0]] += 1
        accepted += v.num_accepted
    freq = counts / SAMPLES
    tolerance = 4.5 * (TARGET * (1 - TARGET) / SAMPLES).sqrt()
    assert ((freq - TARGET).abs() <= tolerance).all(), (freq, TARGET)
    # and drafts were accepted as often as the target gives them mass
    assert abs(accepted / SAMPLES - float(TARGET[draft])) <= 4.5 * math.sqrt(0.25 / SAMPLES)


def test_rejection_sampling_applies_temperature_top_k_and_top_p_to_the_target():
    """The distribution kept is the one plain sampling draws from: here top_k=2 leaves tokens 0
    and 1 (renormalised to 0.625 / 0.375); a draft outside them is never accepted."""
    logits = TARGET.log().repeat(2, 1)
    params = SamplingParams(temperature=1.0, top_k=2)
    gen = torch.Generator().manual_seed(7)
    counts = torch.zeros(4)
    for _ in range(4_000):
        v = verify_drafts(logits, [3], params, gen)
        assert v.num_accepted == 0
        counts[v.token_ids[0]] += 1
    assert counts[2:].sum() == 0 and abs(counts[0] / 4_000 - 0.625) < 0.04


def test_stats_count_drafts_acceptance_and_positions():
    stats = SpecStats()
    stats.record(3, 2)
    stats.record(3, 0)
    stats.record(1, 1)
    stats.record(0, 0)  # a step without drafts is not a draft
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 7, 3)
    assert stats.accepted_per_position == [2, 1, 0] and stats.drafts_per_position == [3, 2, 2]
    assert stats.mean_accepted_length == 2.0
    assert stats.to_json()["acceptance_rate"] == pytest.approx(3 / 7, abs=5e-5)  # the JSON keeps 4 decimals
