"""Greedy tokens of the engine equal transformers' `generate` (float32) on tiny random checkpoints.

For Qwen3, Qwen3-MoE and DeepSeek-V3: tp 1 and 2, HND and NHD, a batch of ten prompts of mixed
lengths, and chunked prefill with chunks shorter than the prompts. Where tokens differ, the first
difference must be a near-tie (each side's token in the other's top-5) and in at most 1 of 10
prompts (the issue's acceptance rule). Every page is free again once the batch drains.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from disaggsdk.cli.main import main as cli_main  # noqa: E402
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from tests.hf_checkpoints import HF_CONFIG, save_hf_checkpoint  # noqa: E402

PROMPT_LENGTHS = (1, 3, 5, 8, 13, 17, 24, 31, 40, 57)
MAX_TOKENS = 10
TOP = 5
# (tp, layout, page_size, max_num_batched_tokens): budgets 7 and 11 cut every longer prompt into chunks
# the default run keeps one tp 1 and one tp 2 case (small pages, a tight token budget); `make test-all` all four
CASES = [pytest.param(1, "HND", 16, 2048, marks=pytest.mark.slow), (1, "NHD", 4, 7), (2, "HND", 4, 11),
         pytest.param(2, "NHD", 16, 2048, marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=sorted(HF_CONFIG))
def reference(request, tmp_path_factory):
    """(checkpoint dir, prompts, HF greedy tokens, HF top-5 ids per step) of one family."""
    name = request.param
    directory = tmp_path_factory.mktemp(name)
    model = save_hf_checkpoint(name, directory)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
    tokens, tops = [], []
    with torch.no_grad():
        for p in prompts:
            out = model.generate(
                torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False, pad_token_id=258,
                return_dict_in_generate=True, output_scores=True,
            )
            tokens.append(out.sequences[0, len(p):].tolist())
            tops.append([s[0].topk(TOP).indices.tolist() for s in out.scores])
    return str(directory), prompts, tokens, tops


def check_against_hf(ref_tokens, ref_tops, got_tokens, got_tops) -> None:
    """Exact match, or a first difference that is a near-tie, in at most one prompt of ten."""
    differing = []
    for i, (want, got) in enumerate(zip(ref_tokens, got_tokens)):
        if want == got:
            continue
        j = next(k for k, (a, b) in enumerate(zip(want, got)) if a != b)
        near_tie = got[j] in ref_tops[i][j] and want[j] in got_tops[i][j]
        assert near_tie, f"prompt {i}: token {j} is {got[j]} but transformers gives {want[j]} (not a near-tie)"
        differing.append(i)
    assert len(differing) <= len(ref_tokens) // 10, f"near-ties in prompts {differing}: more than 1 in 10"


@pytest.mark.parametrize("tp,layout,page_size,budget", CASES,
                         ids=["tp{}-{}-p{}-b{}".format(*getattr(c, "values", c)) for c in CASES])
def test_greedy_tokens_equal_transformers(reference, tp, layout, page_size, budget):
    directory, prompts, ref_tokens, ref_tops = reference
    config = EngineConfig(tp=tp, layout=layout, page_size=page_size, num_pages=128, max_num_batched_tokens=budget)
    with LLMEngine(directory, config) as engine:
        outs = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP))
        assert engine.kv.num_free_pages == config.num_pages and not engine.has_unfinished()
    got_tokens = [o.output_ids for o in outs]
    got_tops = [[[t for t, _ in lp.top] for lp in o.new_logprobs] for o in outs]
    check_against_hf(ref_tokens, ref_tops, got_tokens, got_tops)


@pytest.mark.deps_smoke  # make test-latest / test-oldest (tools/deps_check.py)
def test_generate_cli_json_equals_transformers(reference, capsys):
    directory, prompts, ref_tokens, ref_tops = reference
    argv = ["generate", "--model", directory, "--max-tokens", str(MAX_TOKENS), "--ignore-eos", "--json",
            "--logprobs", str(TOP), "--page-size", "8", "--max-num-batched-tokens", "16"]
    for p in prompts:
        argv += ["--prompt-ids", ",".join(map(str, p))]
    assert cli_main(argv) == 0
    outputs = json.loads(capsys.readouterr().out)["outputs"]
    assert [o["prompt_ids"] for o in outputs] == prompts
    got_tops = [[[t for t, _ in lp["top"]] for lp in o["logprobs"]] for o in outputs]
    check_against_hf(ref_tokens, ref_tops, [o["token_ids"] for o in outputs], got_tops)
