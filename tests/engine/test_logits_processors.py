"""Penalties, logit bias, min_tokens and min_p against reference implementations written from vLLM's
formulas, and through the engine: greedy tokens with speculation equal those without, whatever the
processors."""

from __future__ import annotations

import math
import random

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.logits_processors import process_rows  # noqa: E402
from disaggsdk.engine.sampling import target_probs  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingError, SamplingParams  # noqa: E402
from disaggsdk.engine.speculative.config import SpeculativeConfig  # noqa: E402

VOCAB = 50


def reference(logits: list[float], p: SamplingParams, prompt: list[int], out: list[int], eos: set[int]) -> list[float]:
    """vLLM's order and formulas, one element at a time."""
    x = list(logits)
    for t, b in p.logit_bias:
        x[t] += b
    if len(out) < p.min_tokens:
        for t in (*eos, *p.stop_token_ids):
            x[t] = -math.inf
    for t in range(len(x)):
        if p.repetition_penalty != 1.0 and (t in prompt or t in out):
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        x[t] -= p.frequency_penalty * out.count(t)
        x[t] -= p.presence_penalty * (t in out)
    return x


@pytest.mark.parametrize("seed", range(6))
def test_processors_equal_the_reference(seed):
    rng = random.Random(seed)
    p = SamplingParams(max_tokens=20, presence_penalty=rng.uniform(-2, 2), frequency_penalty=rng.uniform(-2, 2),
                       repetition_penalty=rng.choice([1.0, 0.7, 1.3]), min_tokens=rng.randint(0, 6),
                       logit_bias=((3, 5.0), (7, -100.0)), stop_token_ids=(11,))
    prompt = [rng.randrange(VOCAB) for _ in range(8)]
    outputs = [[rng.randrange(VOCAB) for _ in range(n)] for n in (0, 2, 5)]
    rows = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(seed))
    want = [reference(rows[i].tolist(), p, prompt, outputs[i], {1}) for i in range(3)]
    process_rows(rows, p, prompt, outputs, frozenset({1}))
    assert torch.allclose(rows, torch.tensor(want), atol=1e-5)


def test_min_p_keeps_tokens_at_least_min_p_times_the_top():
    row = torch.log(torch.tensor([0.5, 0.3, 0.12, 0.08]))
    probs = target_probs(row, SamplingParams(temperature=1.0, min_p=0.2))
    assert probs[3] == 0 and probs[2] > 0  # 0.08 < 0.2 * 0.5 <= 0.12
    assert torch.allclose(probs[:3] / probs[:3].sum(), torch.tensor([0.5, 0.3, 0.12]) / 0.92)


def test_bad_values_are_refused():
    for kwargs, match in [({"presence_penalty": 3.0}, "presence_penalty"), ({"repetition_penalty": 0.0}, "repetition"),
                          ({"min_tokens": 9, "max_tokens": 4}, "min_tokens"), ({"min_p": 1.5}, "min_p"),
                          ({"logit_bias": ((1, 200.0),)}, "logit_bias")]:
        with pytest.raises(SamplingError, match=match):
            SamplingParams(**kwargs)


def test_greedy_with_processors_is_the_same_with_and_without_drafts():
    params = SamplingParams(max_tokens=32, repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3,
                            min_tokens=32, logit_bias=((5, 2.0),))
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8], [9, 10, 11, 9, 10, 11]]
    results = []
    for spec in (None, SpeculativeConfig("ngram", 3)):
        with LLMEngine("qwen3-coder-tiny", EngineConfig(num_pages=64, page_size=4, speculative=spec)) as engine:
            results.append([o.output_ids for o in engine.generate(prompts, params)])
            plain_params = SamplingParams(max_tokens=32, min_tokens=32)
            unpenalised = [o.output_ids for o in engine.generate(prompts, plain_params)]
    assert results[0] == results[1]
    assert results[0] != unpenalised  # the penalties did change the greedy choice
    assert all(len(o) == 32 for o in results[0])
