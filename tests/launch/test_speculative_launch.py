"""Speculative decoding in deployments: n-gram and MTP drafting on the decode units of disaggregated
runs (real processes over shm and tcp; with MTP the prefill unit fills the MTP layer's KV and streams
it as one more layer) and on colocated units give the greedy tokens of the plain engine, with drafts
accepted and every page back."""

from __future__ import annotations

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from disaggsdk.engine.sampling import SamplingParams  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402
from disaggsdk.plan import make_plan  # noqa: E402
from disaggsdk.serve.local import serve_locally  # noqa: E402
from disaggsdk.spec.types import Speculative  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402

PROMPTS = ["def fib(n):", "class Stack:\n    def __init__(self):", "import os\nimport sys\n\n",
           "for i in range(10):\n    if i % 2", "    return self._", "with open(path) as f:\n"]
MAX_TOKENS = 24


def plain_tokens(model: str, prompts: list[list[int]]) -> list[list[int]]:
    with LLMEngine(model, EngineConfig(page_size=4, num_pages=128)) as engine:
        return [o.output_ids for o in engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]


@pytest.mark.parametrize("model,method,k,provider,colocated", [
    ("qwen3-coder-tiny", "ngram", 3, "shm", False),
    ("qwen3-coder-tiny", "ngram", 3, "tcp", False),
    ("deepseek-r1-tiny", "mtp", 1, "shm", False),
    ("deepseek-r1-tiny", "mtp", 3, "tcp", False),
    ("deepseek-r1-tiny", "mtp", 1, "shm", True),
], ids=["ngram-k3-disaggregated-shm", "ngram-k3-disaggregated-tcp", "mtp-k1-disaggregated-shm",
        "mtp-k3-disaggregated-tcp", "mtp-k1-colocated"])
def test_speculative_deployment_keeps_greedy_tokens_and_accepts_drafts(model, method, k, provider, colocated):
    prompts = [load_tokenizer(model).encode(p) for p in PROMPTS]
    want = plain_tokens(model, prompts)
    spec = attrs.evolve(make_spec(model, provider=provider, num_pages=128, budget=32),
                        speculative=Speculative(method, k))
    before = live_descendants()
    with serve_locally(spec, colocated=colocated, on_event=lambda _line: None) as rt:
        events = rt.generate_batch(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), timeout_s=120)
        stats = rt.unit_stats()
        instances = rt.stats()
    assert live_descendants() <= before, "a unit or tp worker outlived close()"
    got = [[t for e in ev for t in e.new_token_ids] for ev in events]
    assert got == want
    drafting = [s for s in stats.values() if s.role in ("decode", "mixed")]
    assert sum(s.spec_num_accepted_tokens for s in drafting) > 0  # drafts were made and kept
    assert all(s.spec_num_drafts == 0 for s in stats.values() if s.role == "prefill")
    assert all(s.num_free_pages == s.num_pages for s in stats.values())
    assert sum(i.spec_num_accepted_tokens for i in instances) == sum(s.spec_num_accepted_tokens for s in drafting)
    if not colocated:  # every layer's pages travelled, the MTP layer's too: one write per page and layer
        (prefill,) = [s for s in stats.values() if s.role == "prefill"]
        kv_layers = make_plan(spec).kv_layers
        assert kv_layers == 4 + (method == "mtp")
        pages = sum(-(-(len(p) - 1) // spec.kv.page_size) for p in prompts)
        assert prefill.transfer_writes == pages * kv_layers + len(prompts)  # + one context write each
    if method == "mtp":  # first drafts from the MTP layer over the prompt's own KV are mostly right
        first_accepted = sum(s.spec_accepted_per_position[0] for s in drafting)
        assert first_accepted > 0.5 * sum(s.spec_num_drafts for s in drafting)

