"""The compiled step (torch.compile with attention and the layer counter as graph ops) against eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.compiled_step import COMPILE_ENV, CompiledStep, compile_by_default  # noqa: E402
from disaggsdk.engine.llm_engine import EngineConfig, LLMEngine  # noqa: E402
from disaggsdk.engine.sampling import SamplingParams  # noqa: E402

PROMPT_LENGTHS = (5, 17, 40, 1, 64)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, 250, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def generate(model: str, compile: bool) -> tuple[dict[str, list[int]], dict[str, list]]:
    config = EngineConfig(page_size=4, num_pages=256, max_num_batched_tokens=32, compile=compile)
    ids: dict[str, list[int]] = {}
    lps: dict[str, list] = {}
    with LLMEngine(model, config) as engine:
        assert (engine.runner.compiled is not None) == compile
        for i, p in enumerate(prompts()):
            engine.add_request(f"r{i}", p, SamplingParams(max_tokens=8, ignore_eos=True, logprobs=3))
        while engine.has_unfinished():
            for out in engine.step():
                ids.setdefault(out.request_id, []).extend(out.new_token_ids)
                lps.setdefault(out.request_id, []).extend(out.new_logprobs)
    return ids, lps


def check_compiled_equals_eager(model: str) -> None:
    eager_ids, eager_lps = generate(model, compile=False)
    ids, lps = generate(model, compile=True)
    assert ids == eager_ids and len(ids) == len(PROMPT_LENGTHS)
    for rid, eager_seq in eager_lps.items():
        assert len(eager_seq) == len(lps[rid]) == 8
        for a, b in zip(eager_seq, lps[rid]):
            assert [t for t, _ in a.top] == [t for t, _ in b.top]
            assert b.logprob == pytest.approx(a.logprob, abs=1e-4)


def test_compiled_dense_model_generates_what_eager_does():
    """Chunked prefill (a 32-token budget splits the 40- and 64-token prompts), decode, one-token
    prompts: the same greedy tokens and top-3 as the eager engine (itself checked against
    transformers in test_parity_hf)."""
    check_compiled_equals_eager("qwen3-tiny")


@pytest.mark.slow
@pytest.mark.parametrize("model", ["qwen3-coder-tiny", "deepseek-r1-tiny"])
def test_compiled_moe_and_mla_models_generate_what_eager_does(model):
    """MoE experts run eagerly inside the graph (their token counts are data); MLA goes through
    the attention_mla op."""
    check_compiled_equals_eager(model)


def test_layer_counter_is_bumped_by_the_graph_op_in_layer_order(monkeypatch):
    from disaggsdk.engine.hooks import LayerCounter

    calls = []
    original = LayerCounter.on_layer_done

    def spy(self, layer_id, output=None):
        calls.append((layer_id, output is None))
        original(self, layer_id, output)

    config = EngineConfig(page_size=4, num_pages=64, compile=True, count_layers=True)
    with LLMEngine("qwen3-tiny", config) as engine:
        monkeypatch.setattr(LayerCounter, "on_layer_done", spy)  # still a LayerCounter's method
        engine.add_request("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=1))
        engine.step()
        # the graph op calls the counter without the output (which only orders the graph); the
        # eager model would have passed it
        assert calls == [(layer, True) for layer in range(engine.arch.num_layers)]
        step_id, layers = engine.layer_counter.read()
        assert engine.layer_counter.values.tolist() == [step_id, layers] == [step_id, engine.arch.num_layers]


def test_an_arbitrary_layer_callback_runs_the_step_eagerly():
    """Only a `LayerCounter` can be a graph op; any other callback gets its eager calls, with outputs."""
    from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch

    with LLMEngine("qwen3-tiny", EngineConfig(page_size=4, num_pages=64, compile=True)) as engine:
        assert isinstance(engine.runner.compiled, CompiledStep)
        seen = []
        batch = build_forward_batch([BatchItem([5, 6, 7], 0, [1])], 4,
                                    on_layer_done=lambda layer, out: seen.append((layer, tuple(out.shape))))
        engine.runner.run(batch)
    assert seen == [(layer, (3, engine.arch.hidden_size)) for layer in range(engine.arch.num_layers)]


def test_compile_default_follows_the_environment(monkeypatch):
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    assert compile_by_default()
    monkeypatch.setenv(COMPILE_ENV, "0")
    assert not compile_by_default()
    with LLMEngine("qwen3-tiny", EngineConfig(page_size=4, num_pages=16)) as engine:
        assert engine.runner.compiled is None
