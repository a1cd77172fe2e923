"""Speculative decoding in the engine: greedy tokens equal decoding without it, drafts are accepted,
sampled requests run, and pages return to the pool (aborts included); bad settings are refused."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig, EngineError  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.speculative.config import SpeculativeConfig, SpeculativeConfigError  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402

PROMPTS = ["def fib(n):", "class Stack:\n    def __init__(self):", "import os\nimport sys\n\n",
           "for i in range(10):\n    if i % 2", "    return self._", "# Copyright", "x = [1, 2, 3]\n",
           "with open(path) as f:\n"]
MAX_TOKENS = 40
# small pages and a small step budget: speculative chunks cross page boundaries, prompts are
# prefilled in chunks beside decoding requests
SMALL = dict(num_pages=160, page_size=4, max_num_batched_tokens=24)


def greedy_run(model: str, spec: SpeculativeConfig | None):
    tok = load_tokenizer(model)
    prompts = [tok.encode(p) for p in PROMPTS]
    with LLMEngine(model, EngineConfig(**SMALL, speculative=spec)) as engine:
        outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2))
        assert engine.kv.num_free_pages == SMALL["num_pages"] and not engine.has_unfinished()
        return outs, engine.spec_stats


@pytest.mark.parametrize("model,method,k", [("deepseek-r1-tiny", "mtp", 1), ("deepseek-r1-tiny", "mtp", 3),
                                            ("qwen3-coder-tiny", "ngram", 3)],
                         ids=["mtp-k1", "mtp-k3", "ngram-k3"])
def test_greedy_tokens_with_speculation_equal_those_without(model, method, k):
    plain, _ = greedy_run(model, None)
    spec, stats = greedy_run(model, SpeculativeConfig(method, k))
    assert [o.output_ids for o in spec] == [o.output_ids for o in plain]
    assert all(len(o.output_ids) == MAX_TOKENS for o in spec)
    for a, b in zip(spec, plain):  # the logprobs of each token are the target's, as without drafts
        assert [lp.token_id for lp in a.new_logprobs] == a.output_ids
        # float32 log-softmax of the same logits summed in another order (k + 1 verify rows against
        # one decode row, and each CPU's GEMM kernel): 2e-6 to 5e-6 apart on AMX and AVX2 runs here,
        # larger elsewhere; 1e-3 leaves room for that and still catches a draft's logprob in the
        # target's place. Never rounding: a 1e-6 difference can cross a rounding edge.
        assert [lp.logprob for lp in a.new_logprobs] == pytest.approx([lp.logprob for lp in b.new_logprobs],
                                                                      rel=0, abs=1e-3)
    assert stats.num_accepted_tokens > 0 and stats.num_drafts > 0  # drafts were proposed and kept
    assert len(stats.accepted_per_position) == k and stats.mean_accepted_length > 1.3


@pytest.mark.parametrize("model,method,k", [("deepseek-r1-tiny", "mtp", 3), ("qwen3-coder-tiny", "ngram", 3)],
                         ids=["mtp-k3", "ngram-k3"])
def test_tp2_speculation_keeps_the_greedy_tokens_of_tp1(model, method, k):
    """The MTP layer is sharded like the target: rank 0 mirrors each of its calls to the worker."""
    tok = load_tokenizer(model)
    prompts = [tok.encode(p) for p in PROMPTS[:4]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    with LLMEngine(model, EngineConfig(**SMALL)) as engine:
        want = [o.output_ids for o in engine.generate(prompts, params)]
    with LLMEngine(model, EngineConfig(**SMALL, tp=2, speculative=SpeculativeConfig(method, k))) as engine:
        got = [o.output_ids for o in engine.generate(prompts, params)]
        assert engine.spec_stats.num_accepted_tokens > 0
        assert engine.kv.num_free_pages == SMALL["num_pages"]
    assert got == want


def test_sampled_requests_and_aborts_leave_no_page_behind():
    """100 requests, greedy and sampled, of many lengths; every seventh aborted midway."""
    rng = random.Random(0)
    tok = load_tokenizer("deepseek-r1-tiny")
    config = EngineConfig(num_pages=96, page_size=4, max_num_batched_tokens=32, max_num_seqs=12,
                          speculative=SpeculativeConfig("mtp", 2))
    with LLMEngine("deepseek-r1-tiny", config) as engine:
        for i in range(100):
            prompt = tok.encode(rng.choice(PROMPTS) * rng.randint(1, 3))
            temperature = rng.choice([0.0, 0.7, 1.0])
            engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=rng.randint(1, 24), temperature=temperature,
                                                               top_p=rng.choice([1.0, 0.9]), seed=i))
        finished, steps = {}, 0
        while engine.has_unfinished():
            for out in engine.step():
                assert all(0 <= t < 4096 for t in out.new_token_ids)
                if out.finished:
                    finished[out.request_id] = out
            steps += 1
            if steps % 5 == 0:
                for i in range(0, 100, 7):
                    engine.abort(f"r{i}")
        assert engine.kv.num_free_pages == config.num_pages
        assert all(len(o.output_ids) <= 24 for o in finished.values())
        assert engine.spec_stats.num_accepted_tokens > 0


def test_settings_the_engine_cannot_run_are_refused_with_the_fix():
    with pytest.raises(EngineError, match="no MTP layer.*ngram"):
        LLMEngine("qwen3-coder-tiny", EngineConfig(num_pages=8, speculative=SpeculativeConfig("mtp", 1)))
    with pytest.raises(EngineError, match="does not run in a decode_only engine"):
        LLMEngine("qwen3-coder-tiny", EngineConfig(num_pages=8, mode="decode_only",
                                                   speculative=SpeculativeConfig("ngram", 1)))
    with pytest.raises(SpeculativeConfigError, match="unknown speculative method 'eagle'"):
        SpeculativeConfig("eagle")
    with pytest.raises(SpeculativeConfigError, match=r"num_tokens must be in \[1, 4\]"):
        SpeculativeConfig("mtp", 5)


def test_mtp_on_a_checkpoint_without_its_weights_is_refused(tmp_path):
    pytest.importorskip("transformers")
    from tests.hf_checkpoints import save_hf_checkpoint

    save_hf_checkpoint("deepseek-r1-tiny", tmp_path)  # transformers saves no MTP layer
    with pytest.raises(EngineError, match="no MTP weights"):
        LLMEngine(str(tmp_path), EngineConfig(num_pages=8, speculative=SpeculativeConfig("mtp", 1)))
