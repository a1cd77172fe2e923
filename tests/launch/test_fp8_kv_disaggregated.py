"""`kv.dtype: fp8` through a disaggregated deployment (real processes, shm): prefill writes fp8
pages, they travel as bytes, decode reads them; tokens equal the colocated fp8 engine's."""

from __future__ import annotations

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from tests.launch._helpers import make_spec, serve_and_generate  # noqa: E402

PROMPT_LENGTHS = (2, 9, 17, 30)
MAX_TOKENS = 6


@pytest.mark.parametrize("model,ptp,dtp", [
    ("qwen3-coder-tiny", 1, 1),
    pytest.param("deepseek-r1-tiny", 1, 1, marks=pytest.mark.slow),
    pytest.param("qwen3-coder-tiny", 2, 1, marks=pytest.mark.slow),
], ids=["qwen-p1-d1", "r1-p1-d1", "qwen-p2-d1"])
def test_fp8_kv_disaggregated_gives_the_colocated_fp8_tokens(model, ptp, dtp):
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 250, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    with LLMEngine(model, EngineConfig(page_size=4, num_pages=128, kv_dtype="fp8")) as engine:
        colocated = [o.output_ids for o in engine.generate(prompts, params)]
    spec = make_spec(model, ptp, dtp)
    spec = attrs.evolve(spec, kv=attrs.evolve(spec.kv, dtype="fp8"))
    _, got, stats = serve_and_generate(spec, prompts, params)
    assert got == colocated
    prefill = [s for s in stats.values() if s.role == "prefill"]
    assert sum(s.counters.transfer_bytes for s in prefill) > 0
    assert sum(s.counters.transfer_failures for s in stats.values()) == 0
    assert not any(s.counters.rejected_frames or s.counters.rejected_requests for s in stats.values())


def test_mtp_draft_kv_streams_as_fp8_and_keeps_the_greedy_tokens():
    """With MTP the prefill unit fills the MTP layer's KV in the same fp8 pool and streams it as one
    more layer; decode drafts from it and gives the plain fp8 engine's greedy tokens."""
    from disaggsdk.engine.tokenizer import load_tokenizer
    from disaggsdk.spec.engine_settings import Speculative

    model = "deepseek-r1-tiny"
    prompts = [load_tokenizer(model).encode(p) for p in ("def fib(n):", "class Stack:\n    def __init__(self):",
                                                          "for i in range(10):\n    if i % 2")]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    with LLMEngine(model, EngineConfig(page_size=4, num_pages=128, kv_dtype="fp8")) as engine:
        want = [o.output_ids for o in engine.generate(prompts, params)]
    spec = make_spec(model, num_pages=128, budget=32)
    spec = attrs.evolve(spec, kv=attrs.evolve(spec.kv, dtype="fp8"), speculative=Speculative("mtp", 1))
    _, got, stats = serve_and_generate(spec, prompts, params)
    assert got == want
    (prefill,) = [s for s in stats.values() if s.role == "prefill"]
    (decode,) = [s for s in stats.values() if s.role == "decode"]
    assert decode.counters.spec_num_accepted_tokens > 0
    # one write per page and layer (the model's 4 and the MTP layer), plus one context write per request
    pages = sum(-(-(len(p) - 1) // spec.kv.page_size) for p in prompts)
    assert prefill.counters.transfer_writes == pages * 5 + len(prompts)
