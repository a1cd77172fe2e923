"""Prompt logprobs (vLLM's ``prompt_logprobs``) equal transformers' on the shipped trained checkpoints.

Reference: the float32 transformers model of the same checkpoint, ``log_softmax(logits)[i, prompt[i+1]]``
for every prompt position; the engine must give the same numbers whatever its chunking, and the same
top-N alternatives.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.models.shipped import shipped_checkpoint  # noqa: E402

PROMPT_TEXT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +"
TOP = 3


def reference_prompt_logprobs(model: str, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, vocab] log-softmaxed float32 logits of transformers, row i scoring token i + 1."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(shipped_checkpoint(model), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([prompt])).logits[0, :-1].float()
    return logits.log_softmax(-1)


def prompt_ids(model: str) -> list[int]:
    tok = transformers.AutoTokenizer.from_pretrained(shipped_checkpoint(model))
    return tok(PROMPT_TEXT)["input_ids"]


@pytest.mark.parametrize("model", ["qwen3-tiny", "deepseek-r1-tiny"])
def test_prompt_logprobs_equal_transformers_whatever_the_chunking(model):
    prompt = prompt_ids(model)
    ref = reference_prompt_logprobs(model, prompt)
    for budget in (512, 5):  # one chunk; chunks of 5 tokens (rows cross chunk boundaries)
        engine = LLMEngine(model, EngineConfig(dtype="float32", max_num_batched_tokens=budget, compile=False))
        out = engine.generate([prompt], SamplingParams(max_tokens=2, prompt_logprobs=TOP))[0]
        lps = out.prompt_logprobs
        assert lps is not None and len(lps) == len(prompt) and lps[0] is None
        for i, lp in enumerate(lps[1:]):
            assert lp.token_id == prompt[i + 1]
            assert lp.logprob == pytest.approx(float(ref[i, prompt[i + 1]]), abs=1e-4)
            want = ref[i].topk(TOP)
            assert [t for t, _ in lp.top] == want.indices.tolist()
            assert [v for _, v in lp.top] == pytest.approx(want.values.tolist(), abs=1e-4)


def test_prefill_only_engine_scores_the_whole_prompt():
    """A prefill unit computes prompt[:-1]: its rows score tokens 1..len-1, all of them."""
    prompt = prompt_ids("qwen3-tiny")
    ref = reference_prompt_logprobs("qwen3-tiny", prompt)
    engine = LLMEngine("qwen3-tiny", EngineConfig(dtype="float32", mode="prefill_only", max_num_batched_tokens=8,
                                                  compile=False))
    engine.add_request("r", prompt, SamplingParams(max_tokens=1, prompt_logprobs=0))
    given = []
    while engine.has_unfinished():
        given += [o.prompt_logprobs for o in engine.step() if o.prompt_logprobs is not None]
    assert len(given) == 1, "the prompt's logprobs are given once, when complete"
    scored = [lp.logprob for lp in given[0][1:]]
    assert scored == pytest.approx([float(ref[i, prompt[i + 1]]) for i in range(len(prompt) - 1)], abs=1e-4)
    assert all(lp.top == () for lp in given[0][1:])


def test_decode_engine_that_did_not_prefill_reports_no_prompt_logprobs():
    """Admitted with its KV (computed elsewhere), a request cannot score its prompt: it says nothing."""
    engine = LLMEngine("qwen3-tiny", EngineConfig(dtype="float32", mode="decode_only", compile=False))
    prompt = prompt_ids("qwen3-tiny")
    engine.kv.allocate_pages("r", len(prompt) - 1)
    engine.kv.add_prefilled_request("r", prompt, SamplingParams(max_tokens=2, prompt_logprobs=1))
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    assert all(o.prompt_logprobs is None for o in outs) and outs[-1].finished


def test_prompt_logprobs_survive_preemption_without_scoring_twice():
    """A preempted request recomputes its prompt; what it had scored stays, nothing is scored twice."""
    prompt = prompt_ids("qwen3-tiny")
    engine = LLMEngine("qwen3-tiny", EngineConfig(dtype="float32", max_num_batched_tokens=6, compile=False))
    params = SamplingParams(max_tokens=3, prompt_logprobs=0)
    engine.add_request("r", prompt, params)
    engine.step()  # the first chunk is scored
    req = engine.scheduler.find("r")
    scored_before = list(req.prompt_logprobs)
    from disaggsdk.engine.scheduler import SchedulerOutput

    engine.scheduler._preempt(req, SchedulerOutput())  # what running out of pages does
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    final = [o.prompt_logprobs for o in outs if o.prompt_logprobs is not None]
    assert len(final) == 1 and len(final[0]) == len(prompt)
    assert final[0][: len(scored_before)] == scored_before


def test_prompt_logprobs_are_checked():
    with pytest.raises(Exception, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
