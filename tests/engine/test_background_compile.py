"""An engine that compiles its step in the background (engine.background_compile): it serves at
once on the eager step, takes the compiled step at a step boundary when it is ready (the same
tokens throughout), never lets the warm-up touch its pool or its layer counter, and stays eager
with one warning naming `engine.compile` when the compile fails."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine import background_compile  # noqa: E402
from disaggsdk.engine.compile_progress import CompileProgress  # noqa: E402
from disaggsdk.engine.compiled_step.torch_compile import CompiledStep  # noqa: E402
from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402

MODEL = "qwen3-tiny"
PROMPT = list(range(5, 45))


def _config(compile: bool) -> EngineConfig:
    return EngineConfig(page_size=4, num_pages=128, max_num_batched_tokens=32, compile=compile, count_layers=True)


def _eager_ids(max_tokens: int) -> list[int]:
    with LLMEngine(MODEL, _config(False)) as engine:
        return engine.generate([PROMPT], SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0].output_ids


def test_serves_eagerly_at_once_then_runs_compiled_with_the_same_tokens():
    events: list[CompileProgress] = []
    with LLMEngine(MODEL, _config(True), on_compile=events.append) as engine:
        assert [e.stage for e in events] == ["compiling"] and engine.runner.step is None
        pool_before = engine.kv.cache.buffer.clone()
        counter_before = engine.layer_counter.read()
        engine.add_request("r", PROMPT, SamplingParams(max_tokens=48, ignore_eos=True))
        ids: list[int] = []
        while not ids:  # the prefill's chunks and the first token run eagerly while the step compiles
            for out in engine.step():
                ids += out.new_token_ids
            assert engine.runner.step is None
        assert engine.runner.compilation is not None and engine.runner.compilation.wait(600)
        # ended, but not taken yet: the engine takes it at its next step boundary, not mid-step
        assert engine.runner.step is None and [e.stage for e in events] == ["compiling"]
        while engine.has_unfinished():
            for out in engine.step():
                ids += out.new_token_ids
        assert isinstance(engine.runner.step, CompiledStep)
        assert [e.stage for e in events] == ["compiling", "compiled"] and events[1].elapsed_s > 0
    assert ids == _eager_ids(48)  # the request crossed the switch with the eager engine's tokens
    # the warm-up ran on a scratch cache: it wrote no page of the pool the request did not hold
    used = engine.kv.cache.buffer != pool_before
    assert counter_before == (0, 0) and used.any()  # the request's own pages changed, as they must
    with LLMEngine(MODEL, _config(True)) as idle:
        pool = idle.kv.cache.buffer.clone()
        assert idle.wait_for_compiled_step(600) is True
        assert torch.equal(idle.kv.cache.buffer, pool) and idle.layer_counter.read() == (0, 0)


def test_a_failed_compile_leaves_the_engine_eager_with_one_warning(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise TypeError("BooleanAtom not allowed in this context")

    monkeypatch.setattr(background_compile, "warm_up_graphs", broken)
    events: list[CompileProgress] = []
    with LLMEngine(MODEL, _config(True), on_compile=events.append) as engine:
        assert engine.wait_for_compiled_step(60) is False and engine.runner.step is None
        out = engine.generate([PROMPT], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert [e.stage for e in events] == ["compiling", "failed"]
    assert events[1].error == "TypeError: BooleanAtom not allowed in this context"
    assert out.output_ids == _eager_ids(8)
    with caplog.at_level(logging.WARNING), LLMEngine(MODEL, _config(True)) as engine:  # no listener: a log line
        engine.wait_for_compiled_step(60)
        engine.generate([PROMPT], SamplingParams(max_tokens=2, ignore_eos=True))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "engine.compile: false" in warnings[0] and "BooleanAtom" in warnings[0]


def test_compile_before_serving_when_asked():
    config = EngineConfig(page_size=4, num_pages=64, compile=True, compile_in_background=False)
    with LLMEngine(MODEL, config) as engine:
        assert isinstance(engine.runner.step, CompiledStep)


@pytest.mark.deps_smoke  # make test-latest / test-oldest (tools/deps_check.py)
def test_compiles_in_the_background_where_this_torch_allows_it_else_before_serving():
    """On torch >= 2.13 in the background; older torch crashed recompiling on the serving thread a
    graph another thread compiled, so it compiles before the engine serves. The same tokens either way."""
    in_background = background_compile.background_supported()
    assert in_background is (tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13))
    with LLMEngine(MODEL, _config(True)) as engine:
        assert (engine.runner.step is None) is in_background
        assert engine.wait_for_compiled_step(600) is True
        out = engine.generate([PROMPT], SamplingParams(max_tokens=16, ignore_eos=True))[0]
    assert out.output_ids == _eager_ids(16)


def test_an_older_torch_compiles_before_the_engine_serves(monkeypatch):
    monkeypatch.setattr(background_compile, "MIN_TORCH_FOR_BACKGROUND", (99, 0))
    with LLMEngine(MODEL, _config(True)) as engine:
        assert isinstance(engine.runner.step, CompiledStep)
