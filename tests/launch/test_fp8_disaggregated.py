"""A block-FP8 checkpoint served disaggregated (prefill and decode units as real processes, CPU): the
tokens of the colocated engine on the same directory, and of transformers on the model dequantized
by hand (tests/engine/test_fp8_checkpoint.py), with tp shards that cut through a scale block."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.models.shipped import shipped_checkpoint  # noqa: E402
from disaggsdk.serve.backends.local import serve_locally  # noqa: E402
from tests.engine.test_fp8_checkpoint import reference_model  # noqa: E402
from tests.launch._helpers import TOP, check_against_hf, hf_greedy, make_spec  # noqa: E402
from tools.fp8_checkpoint import write_fp8_checkpoint  # noqa: E402

PROMPT_LENGTHS = (1, 3, 8, 14, 21, 33)
MAX_TOKENS = 6
# (model, prefill tp, decode tp, provider): decode tp 2 splits DeepSeek's 128-wide expert blocks in
# two; the second case (Qwen3-MoE, prefill tp 2 over tcp) is `make test-all`'s
CASES = [("deepseek-r1-tiny", 1, 2, "shm"),
         pytest.param("qwen3-coder-tiny", 2, 1, "tcp", marks=pytest.mark.slow)]


@pytest.mark.parametrize("model,ptp,dtp,provider", CASES)
def test_fp8_checkpoint_disaggregated_equals_colocated_and_transformers(tmp_path, model, ptp, dtp, provider):
    directory = tmp_path / "fp8"
    write_fp8_checkpoint(shipped_checkpoint(model), directory)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 4000, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    ref_tokens, ref_tops = hf_greedy(reference_model(directory, tmp_path), prompts, MAX_TOKENS)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)
    with LLMEngine(str(directory), EngineConfig(page_size=4, num_pages=128)) as engine:
        colocated = [o.output_ids for o in engine.generate(prompts, params)]
    spec = make_spec(str(directory), ptp, dtp, 1, provider)
    with serve_locally(spec, on_event=lambda _line: None) as rt:
        events = rt.generate_batch(prompts, params, timeout_s=120)
        stats = rt.unit_stats()
    assert all(ev[-1].finish_reason == "length" for ev in events), [ev[-1].error for ev in events]
    got = [[t for e in ev for t in e.new_token_ids] for ev in events]
    got_tops = [[[t for t, _ in lp.top] for e in ev for lp in e.new_logprobs] for ev in events]
    assert got == colocated
    check_against_hf(ref_tokens, ref_tops, got, got_tops)
    prefill = [s for s in stats.values() if s.role == "prefill"]
    assert sum(s.counters.transfer_bytes for s in prefill) > 0  # the KV did cross from prefill to decode
    assert sum(s.counters.transfer_failures for s in stats.values()) == 0
