"""The compiled step (torch.compile with attention and the layer counter as graph ops) against eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.compiled_step import COMPILE_ENV, compile_by_default  # noqa: E402
from disaggsdk.engine.compiled_step.torch_compile import CompiledStep  # noqa: E402
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402

PROMPT_LENGTHS = (5, 17, 40, 1, 64)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(3, 250, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def generate(model: str, compile: bool) -> tuple[dict[str, list[int]], dict[str, list]]:
    config = EngineConfig(page_size=4, num_pages=256, max_num_batched_tokens=32, compile=compile,
                          compile_in_background=False)
    ids: dict[str, list[int]] = {}
    lps: dict[str, list] = {}
    with LLMEngine(model, config) as engine:
        assert (engine.runner.step is not None) == compile
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


@pytest.mark.deps_smoke  # make test-latest / test-oldest (tools/deps_check.py)
@pytest.mark.parametrize("model", ["qwen3-coder-tiny", pytest.param("deepseek-r1-tiny", marks=pytest.mark.slow)])
def test_compiled_moe_and_mla_models_generate_what_eager_does(model):
    """MoE experts run eagerly inside the graph (their token counts are data); MLA goes through
    the attention_mla op."""
    check_compiled_equals_eager(model)


def test_layer_counter_is_bumped_by_the_graph_op_in_layer_order(monkeypatch):
    from disaggsdk.engine.layer_counter.host import LayerCounter

    calls = []
    original = LayerCounter.on_layer_done

    def spy(self, layer_id, output=None):
        calls.append((layer_id, output is None))
        original(self, layer_id, output)

    config = EngineConfig(page_size=4, num_pages=64, compile=True, compile_in_background=False, count_layers=True)
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

    config = EngineConfig(page_size=4, num_pages=64, compile=True, compile_in_background=False)
    with LLMEngine("qwen3-tiny", config) as engine:
        assert isinstance(engine.runner.step, CompiledStep)
        seen = []
        batch = build_forward_batch([BatchItem([5, 6, 7], 0, [1])], 4,
                                    on_layer_done=lambda layer, out: seen.append((layer, tuple(out.shape))))
        assert not engine.runner.step.can_run(batch)  # the runner runs it eagerly
        engine.runner.run(batch)
    assert seen == [(layer, (3, engine.arch.hidden_size)) for layer in range(engine.arch.num_layers)]


def test_the_registry_builds_the_twin_of_the_device():
    """A CPU rank's compiled step is `CompiledStep`, built by the registry; it runs a batch whose
    layer callback is a `LayerCounter`'s (a graph op) or none."""
    from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch
    from disaggsdk.engine.compiled_step import STEPS, new_compiled_step
    from disaggsdk.engine.layer_counter.host import LayerCounter
    from disaggsdk.engine.model_runner import ModelRunner, RunnerConfig
    from disaggsdk.engine.parallel import TensorParallel

    assert set(STEPS) == {"cpu", "cuda"}
    runner = ModelRunner(RunnerConfig("qwen3-tiny", EngineConfig(num_pages=8, page_size=4)), TensorParallel())
    step = new_compiled_step(runner.device, runner.model, runner.attn, runner.config.engine, None)
    assert isinstance(step, CompiledStep)
    for on_layer_done in (None, LayerCounter().on_layer_done):
        assert step.can_run(build_forward_batch([BatchItem([5], 0, [1])], 4, on_layer_done=on_layer_done))


def test_compile_default_follows_the_environment(monkeypatch):
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    assert compile_by_default()
    monkeypatch.setenv(COMPILE_ENV, "0")
    assert not compile_by_default()
    with LLMEngine("qwen3-tiny", EngineConfig(page_size=4, num_pages=16)) as engine:
        assert engine.runner.step is None


def test_the_compiled_mtp_layer_computes_what_the_eager_one_does():
    """The smoke test of the two below (which compile every graph of an engine): one compiled MTP
    forward and draft (one call) over a planned batch, against the eager layer on the same batch."""
    from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.model_runner import ModelRunner, RunnerConfig
    from disaggsdk.engine.parallel import TensorParallel

    runner = ModelRunner(RunnerConfig("deepseek-r1-tiny", EngineConfig(num_pages=8, page_size=4), extra_kv_layers=1),
                         TensorParallel())
    compiled = CompiledStep(runner.model, runner.attn)
    batch = build_forward_batch([BatchItem([5, 6, 7, 8, 9], 0, [1, 2])], 4)
    with torch.inference_mode():
        hidden_all = runner.run_keeping_hidden(batch)[0]  # plans the backend for the batch
        eager = runner.model.mtp[0](hidden_all, batch.input_ids, batch.positions, runner.attn)
        rows = torch.tensor([4, 1])
        kept, drafts = compiled.mtp_draft(hidden_all, batch.input_ids, batch.positions, rows)
        assert torch.allclose(kept, eager[rows], atol=1e-5)
        expected = runner.model.mtp[0].compute_logits(eager[rows]).argmax(dim=-1)
        assert drafts.tolist() == expected.tolist()


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.deps_smoke), pytest.param(3, marks=pytest.mark.slow)])
def test_compiled_mtp_drafting_accepts_what_eager_does(k, monkeypatch):
    """DeepSeek's MTP layer runs compiled beside the compiled step (its forward and its draft):
    the same tokens and the same accepted drafts as eager drafting, and the compiled layer ran."""
    from disaggsdk.engine.speculative.config import SpeculativeConfig

    calls = []
    original = CompiledStep.mtp_draft
    monkeypatch.setattr(CompiledStep, "mtp_draft", lambda self, *a, **kw: calls.append(1) or original(self, *a, **kw))
    runs = {}
    for compiled in (False, True):
        config = EngineConfig(page_size=4, num_pages=256, max_num_batched_tokens=32, compile=compiled,
                              compile_in_background=False, speculative=SpeculativeConfig("mtp", k))
        with LLMEngine("deepseek-r1-tiny", config) as engine:
            outs = engine.generate(prompts(), SamplingParams(max_tokens=12, ignore_eos=True))
            runs[compiled] = ([o.output_ids for o in outs], engine.spec_stats.num_accepted_tokens)
    assert runs[True] == runs[False] and runs[True][1] > 0
    assert calls  # the compiled MTP forward ran (warm-up and every step)


@pytest.mark.slow
def test_a_prefill_unit_counts_the_compiled_mtp_layer_as_one_more_layer():
    """A prefill-only engine filling the MTP KV: the graph op bumps the counter to num_layers + 1,
    the layer its pages stream as."""
    from disaggsdk.engine.speculative.config import SpeculativeConfig

    config = EngineConfig(page_size=4, num_pages=64, compile=True, compile_in_background=False, count_layers=True,
                          mode="prefill_only", speculative=SpeculativeConfig("mtp", 1))
    with LLMEngine("deepseek-r1-tiny", config) as engine:
        assert engine.runner.step is not None
        engine.add_request("a", [5, 6, 7, 8, 9, 10], SamplingParams(max_tokens=1))
        engine.step()
        step_id, layers = engine.layer_counter.read()
        assert layers == engine.arch.num_layers + 1
