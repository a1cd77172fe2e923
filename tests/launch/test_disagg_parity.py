"""Disaggregated runs (real processes, shm and tcp;ofi_rxm) give the tokens of the colocated
engine and of transformers, for tiny Qwen3-MoE and DeepSeek-V3 checkpoints made with transformers.

Cases cover the route kinds for both families on both providers: identical (1,1), reconstruct
(2,1, with NHD pages for Qwen3-MoE: a write per token per head slice), split (1,2), (2,2), MLA
rank to rank and one to two, and MLA with a data-parallel decode of 2 ranks (the writer rotates per
request); 8 concurrent requests of mixed lengths; a step budget of 12 tokens so longer prompts
prefill in chunks; one case with the streaming ablation. Over tcp, writes go into per-grant keys
and every page is verified against prefill's digest.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from tests.hf_checkpoints import save_hf_checkpoint  # noqa: E402
from tests.launch._helpers import TOP, check_against_hf, hf_greedy, make_spec, serve_and_generate  # noqa: E402

PROMPT_LENGTHS = (1, 2, 5, 9, 17, 23, 30, 41)
MAX_TOKENS = 6
# (model, prefill tp, decode tp, decode dp, provider, streaming); "tcp" is "tcp;ofi_rxm".
# The whole matrix of the issue: both families x both providers x (1,1), (2,1), (1,2), (2,2);
# then the streaming ablation, and MLA with a data-parallel decode of 2 ranks on both providers.
TP_PAIRS = ((1, 1), (2, 1), (1, 2), (2, 2))
CASES = [(model, ptp, dtp, 1, provider, True)
         for model in ("qwen3-coder-tiny", "deepseek-r1-tiny") for provider in ("shm", "tcp") for ptp, dtp in TP_PAIRS]
CASES += [
    ("qwen3-coder-tiny", 1, 2, 1, "shm", False),
    ("deepseek-r1-tiny", 2, 1, 2, "shm", True),
    ("deepseek-r1-tiny", 2, 1, 2, "tcp", True),
]
# The default run keeps three cases that between them cross both families, both providers, a
# prefill tp above and below decode's, and a data-parallel decode; `make test-all` runs the matrix.
SMOKE = {("qwen3-coder-tiny", 2, 1, 1, "tcp", True), ("deepseek-r1-tiny", 1, 2, 1, "shm", True),
         ("deepseek-r1-tiny", 2, 1, 2, "tcp", True)}


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Per model: (checkpoint dir, prompts, transformers tokens, transformers top-5, colocated tokens)."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    out = {}
    for name in sorted({c[0] for c in CASES}):
        directory = tmp_path_factory.mktemp(name)
        model = save_hf_checkpoint(name, directory)
        tokens, tops = hf_greedy(model, prompts, MAX_TOKENS)
        with LLMEngine(str(directory), EngineConfig(page_size=4, num_pages=128)) as engine:
            colocated = [o.output_ids for o in engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS,
                                                                                       ignore_eos=True))]
        out[name] = (str(directory), prompts, tokens, tops, colocated)
    return out


@pytest.mark.parametrize("model,ptp,dtp,ddp,provider,streaming",
                         [pytest.param(*c, marks=() if c in SMOKE else pytest.mark.slow) for c in CASES],
                         ids=[f"{c[0].split('-')[0]}-p{c[1]}-d{c[2]}x{c[3]}-{c[4]}{'' if c[5] else '-ablation'}"
                              for c in CASES])
def test_disaggregated_tokens_equal_colocated_and_transformers(references, model, ptp, dtp, ddp, provider,
                                                               streaming):
    directory, prompts, ref_tokens, ref_tops, colocated = references[model]
    layout = "NHD" if (model, ptp, dtp) == ("qwen3-coder-tiny", 2, 1) else "HND"
    # over tcp every attempt also checks prefill's page digest (grant keys are on there by default):
    # a digest that differs for any route kind would show as a transfer failure below
    spec = make_spec(directory, ptp, dtp, ddp, provider, streaming=streaming, layout=layout,
                     verify_pages=provider == "tcp")
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)
    events, got, stats = serve_and_generate(spec, prompts, params)
    got_tops = [[[t for t, _ in lp.top] for e in ev for lp in e.new_logprobs] for ev in events]
    assert got == colocated
    check_against_hf(ref_tokens, ref_tops, got, got_tops)
    # every page back, on both sides; the prefill side moved bytes; nothing was rejected
    assert all(s.num_free_pages == s.num_pages for s in stats.values()), {n: s.num_free_pages for n, s in stats.items()}
    prefill = [s for s in stats.values() if s.role == "prefill"]
    decode = [s for s in stats.values() if s.role == "decode"]
    assert sum(s.counters.transfer_bytes for s in prefill) > 0 and sum(s.counters.transfer_failures for s in stats.values()) == 0
    assert sum(len([r for r in s.recent]) for s in decode) == len([n for n in PROMPT_LENGTHS if n > 1])
    assert not any(s.counters.rejected_frames or s.counters.rejected_requests for s in stats.values())


# Host mirrors (`transport.kv_staging: host`, what a GPU unit falls back to where the provider cannot
# register device memory): the engines compute in pools the transport never touches, so a page not
# copied to its mirror before the write, or back after landing, would change the tokens.
MIRROR_CASES = [("qwen3-coder-tiny", 2, 1, "tcp", True), ("deepseek-r1-tiny", 1, 2, "shm", False)]


@pytest.mark.parametrize("model,ptp,dtp,provider,streaming",
                         [pytest.param(*c, marks=() if i == 0 else pytest.mark.slow) for i, c in enumerate(MIRROR_CASES)],
                         ids=[f"{c[0].split('-')[0]}-p{c[1]}-d{c[2]}-{c[3]}{'' if c[4] else '-ablation'}"
                              for c in MIRROR_CASES])
def test_tokens_through_host_mirrors_equal_colocated(references, model, ptp, dtp, provider, streaming):
    directory, prompts, ref_tokens, ref_tops, colocated = references[model]
    # over tcp the digests are computed from the mirrors on both sides: they must match too
    spec = make_spec(directory, ptp, dtp, 1, provider, streaming=streaming, verify_pages=provider == "tcp",
                     kv_staging="host")
    events, got, stats = serve_and_generate(spec, prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert got == colocated
    assert all(s.num_free_pages == s.num_pages for s in stats.values())
    assert sum(s.counters.transfer_failures for s in stats.values()) == 0
