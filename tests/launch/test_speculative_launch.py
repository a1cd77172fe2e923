"""Speculative decoding in deployments: n-gram and MTP drafting on the decode units of disaggregated
runs (real processes over shm and tcp; with MTP the prefill unit fills the MTP layer's KV and streams
it as one more layer) and on colocated units give the greedy tokens of the plain engine, with drafts
accepted and every page back, across P/D tp mixes too."""

from __future__ import annotations

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.engine.tokenizer import load_tokenizer  # noqa: E402
from disaggsdk.plan import make_plan  # noqa: E402
from disaggsdk.plan.writes import expected_writes  # noqa: E402
from disaggsdk.serve.backends.local import serve_locally  # noqa: E402
from disaggsdk.spec.engine_settings import Speculative  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402

PROMPTS = ["def fib(n):", "class Stack:\n    def __init__(self):", "import os\nimport sys\n\n",
           "for i in range(10):\n    if i % 2", "    return self._", "with open(path) as f:\n"]
MAX_TOKENS = 24


def plain_tokens(model: str, prompts: list[list[int]]) -> list[list[int]]:
    with LLMEngine(model, EngineConfig(page_size=4, num_pages=128)) as engine:
        return [o.output_ids for o in engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))]


@pytest.mark.parametrize("model,method,k,provider,colocated,tps", [
    ("qwen3-coder-tiny", "ngram", 3, "shm", False, (1, 1)),
    ("qwen3-coder-tiny", "ngram", 3, "tcp", False, (1, 1)),
    ("deepseek-r1-tiny", "mtp", 1, "shm", False, (1, 1)),
    ("deepseek-r1-tiny", "mtp", 3, "tcp", False, (1, 1)),
    ("deepseek-r1-tiny", "mtp", 1, "shm", True, (1, 1)),
    # P/D tp mixes: a tp-2 prefill fills the MTP layer's KV on both ranks for a tp-1 decoder, and
    # a tp-2 decoder drafts with the layer sharded over its ranks
    ("deepseek-r1-tiny", "mtp", 2, "shm", False, (2, 1)),
    ("deepseek-r1-tiny", "mtp", 2, "tcp", False, (1, 2)),
], ids=["ngram-k3-disaggregated-shm", "ngram-k3-disaggregated-tcp", "mtp-k1-disaggregated-shm",
        "mtp-k3-disaggregated-tcp", "mtp-k1-colocated", "mtp-k2-P-tp2-D-tp1-shm", "mtp-k2-P-tp1-D-tp2-tcp"])
def test_speculative_deployment_keeps_greedy_tokens_and_accepts_drafts(model, method, k, provider, colocated, tps):
    prompts = [load_tokenizer(model).encode(p) for p in PROMPTS]
    want = plain_tokens(model, prompts)
    spec = attrs.evolve(make_spec(model, prefill_tp=tps[0], decode_tp=tps[1], provider=provider, num_pages=128,
                                  budget=32), speculative=Speculative(method, k))
    before = live_descendants()
    with serve_locally(spec, colocated=colocated, on_event=lambda _line: None) as rt:
        events = rt.generate_batch(prompts, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True), timeout_s=120)
        stats = rt.unit_stats()
        instances = rt.stats()
    assert live_descendants() <= before, "a unit or tp worker outlived close()"
    got = [[t for e in ev for t in e.new_token_ids] for ev in events]
    assert got == want
    drafting = [s for s in stats.values() if s.role in ("decode", "mixed")]
    assert sum(s.counters.spec_num_accepted_tokens for s in drafting) > 0  # drafts were made and kept
    assert all(s.counters.spec_num_drafts == 0 for s in stats.values() if s.role == "prefill")
    assert all(s.num_free_pages == s.num_pages for s in stats.values())
    accepted = sum(s.counters.spec_num_accepted_tokens for s in drafting)
    assert sum(i.counters.spec_num_accepted_tokens for i in instances) == accepted
    if not colocated:  # every layer's pages travelled, the MTP layer's too: the planner's count
        (prefill,) = [s for s in stats.values() if s.role == "prefill"]
        plan = make_plan(spec)
        assert plan.kv_layers == 4 + (method == "mtp")
        (route,) = plan.routes
        assert prefill.counters.transfer_writes == sum(expected_writes(route, len(p), spec.kv.layout).total for p in prompts)
        if tps == (1, 1):  # one write per page and layer, plus one context write per request
            pages = sum(-(-(len(p) - 1) // spec.kv.page_size) for p in prompts)
            assert prefill.counters.transfer_writes == pages * plan.kv_layers + len(prompts)
    if method == "mtp":  # first drafts from the MTP layer over the prompt's own KV are mostly right
        first_accepted = sum(s.counters.spec_accepted_per_position[0] for s in drafting)
        assert first_accepted > 0.5 * sum(s.counters.spec_num_drafts for s in drafting)

