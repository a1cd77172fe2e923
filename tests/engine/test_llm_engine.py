"""The engine loop: draining frees every page, preemption and abort, the messenger hooks,
admitting a request whose KV arrived from elsewhere, and an external KV buffer."""

from __future__ import annotations

import mmap
import threading

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig, EngineError  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402

MODEL = "qwen3-tiny"
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def prompts(n: int = 6, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3 + 7 * i,), generator=gen).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def reference_tokens():
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=256)) as engine:
        return [o.output_ids for o in engine.generate(prompts(), GREEDY)]


def test_preemption_recomputes_to_the_same_tokens_and_drains(reference_tokens):
    # 14 pages of 4 tokens cannot hold all six requests at once: decodes preempt the newest
    config = EngineConfig(page_size=4, num_pages=14, max_num_batched_tokens=16)
    with LLMEngine(MODEL, config) as engine:
        outs = engine.generate(prompts(), GREEDY)
        assert engine.scheduler.num_preemptions > 0
        assert engine.kv.num_free_pages == 14
    assert [o.output_ids for o in outs] == reference_tokens


def test_abort_frees_pages_and_late_abort_is_harmless():
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=64)) as engine:
        for i, p in enumerate(prompts(3)):
            engine.add_request(f"r{i}", p, GREEDY)
        engine.step()
        engine.step()
        assert engine.kv.num_free_pages < 64
        assert engine.abort("r1")
        while engine.has_unfinished():
            engine.step()
        assert engine.kv.num_free_pages == 64
        assert not engine.abort("r1")
        assert not engine.abort("never-seen")


def test_engines_nobody_streams_from_skip_the_layer_counter():
    """A decode or colocated unit's engine, or an offline one (count_layers off: the default, and
    what `EngineConfig.from_spec` sets for every role but prefill) begins steps but never bumps
    layers: no counter call per layer."""
    from pathlib import Path

    from disaggsdk.spec import load_spec

    spec = load_spec(Path(__file__).resolve().parents[2] / "specs" / "tiny_pd.yaml")
    assert [EngineConfig.from_spec(spec, tp=1, role=r).count_layers for r in ("prefill", "decode", "mixed")] == [
        True, False, False]
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=64, count_layers=False)) as engine:
        engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
        step_id, layers = engine.layer_counter.read()
        assert step_id == 2 and layers == 0


def test_layer_counter_and_step_plan_hooks():
    config = EngineConfig(page_size=4, num_pages=64, max_num_batched_tokens=8, count_layers=True)
    with LLMEngine(MODEL, config) as engine:
        plans, seen = [], []
        engine.on_step = plans.append
        stop = threading.Event()

        def poll():  # the messenger's polling thread
            while not stop.is_set():
                seen.append(engine.layer_counter.read())

        thread = threading.Thread(target=poll)
        thread.start()
        try:
            engine.add_request("a", list(range(20)), SamplingParams(max_tokens=2))
            while engine.has_unfinished():
                engine.step()
                step_id, layers = engine.layer_counter.read()
                assert layers == engine.arch.num_layers
                assert engine.layer_counter.wait(step_id, layers, timeout_s=0)
        finally:
            stop.set()
            thread.join()
        chunks = [c for plan in plans for c in plan]
        assert [(c.start_pos, c.num_tokens, c.is_last_prefill_chunk) for c in chunks] == [
            (0, 8, False), (8, 8, False), (16, 4, True), (20, 1, False)]
        assert len(chunks[2].page_ids) == 5 and chunks[0].page_ids == chunks[2].page_ids[:2]
        assert all(0 <= layers <= engine.arch.num_layers for _, layers in seen)


def test_prefill_elsewhere_then_decode_here_equals_mixed(reference_tokens):
    """The disaggregated flow in one process: prefill_only engine -> copy pages -> decode_only engine."""
    page_size = 4
    prefill = LLMEngine(MODEL, EngineConfig(page_size=page_size, num_pages=128, mode="prefill_only",
                                            return_hidden_states=True))
    decode = LLMEngine(MODEL, EngineConfig(page_size=page_size, num_pages=128, mode="decode_only"))
    with prefill, decode:
        with pytest.raises(EngineError, match="add_prefilled_request"):
            decode.add_request("x", [1, 2], GREEDY)
        for i, p in enumerate(prompts()):
            prefill.add_request(f"r{i}", p, GREEDY)
            decode.kv.allocate_pages(f"r{i}", len(p) - 1)
            assert decode.allocator.is_pinned(f"r{i}")
        done = {}
        while prefill.has_unfinished():
            for out in prefill.step():
                assert out.new_token_ids == []  # prefill never samples
                if out.finished:
                    done[out.request_id] = out
        for i, p in enumerate(prompts()):
            out = done[f"r{i}"]
            assert out.finish_reason == "prefilled" and out.num_computed_tokens == len(p) - 1
            assert out.hidden_state is not None and out.hidden_state.shape == (prefill.arch.hidden_size,)
            src, dst = prefill.allocator.page_ids(f"r{i}"), decode.allocator.page_ids(f"r{i}")
            assert len(src) == len(dst) == -(-(len(p) - 1) // page_size)
            for layer in range(prefill.arch.num_layers):  # what the transfer engine will do
                decode.kv.cache.pool.layer_pages(layer)[dst] = prefill.kv.cache.pool.layer_pages(layer)[src]
            assert prefill.kv.release(f"r{i}") == len(src)
            decode.kv.add_prefilled_request(f"r{i}", p, GREEDY)
        assert prefill.kv.num_free_pages == 128
        tokens = {}
        while decode.has_unfinished():
            for out in decode.step():
                if out.finished:
                    tokens[out.request_id] = out.output_ids
        assert [tokens[f"r{i}"] for i in range(len(prompts()))] == reference_tokens
        assert decode.kv.num_free_pages == 128


def test_external_kv_buffer_receives_the_cache():
    config = EngineConfig(page_size=4, num_pages=16)
    probe = LLMEngine(MODEL, config)
    size = probe.kv.cache.fmt.pool_bytes
    with mmap.mmap(-1, size) as mem:
        engine = LLMEngine(MODEL, config, kv_buffer=mem)
        out = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
        assert any(mem[:size])  # KV bytes landed in the caller's memory
        assert out[0].output_ids == probe.generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0].output_ids
        del engine


def test_seeded_sampling_does_not_depend_on_the_batch():
    p = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, top_k=50, seed=11, ignore_eos=True)
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=64)) as engine:
        alone = engine.generate([[1, 2, 3]], p)[0].output_ids
        crowd = engine.generate([[9] * 5, [1, 2, 3], [4] * 9], [GREEDY, p, GREEDY])[1].output_ids
    assert alone == crowd


def test_bad_requests_are_user_errors():
    with LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=4)) as engine:
        with pytest.raises(EngineError, match="num_pages"):
            engine.add_request("a", list(range(10)), SamplingParams(max_tokens=10))
        engine.add_request("b", [1], GREEDY)
        with pytest.raises(EngineError, match="already in use"):
            engine.add_request("b", [1], GREEDY)
        with pytest.raises(EngineError, match="vocabulary"):
            engine.add_request("c", [10**6], GREEDY)


def test_random_load_with_aborts_returns_every_page():
    """A small soak: arrivals, aborts and preemptions in a tight pool; no page may leak."""
    rng = torch.Generator().manual_seed(4)
    config = EngineConfig(page_size=4, num_pages=24, max_num_batched_tokens=12)
    with LLMEngine(MODEL, config) as engine:
        live: list[str] = []
        mixed_steps = 0

        def count_mixed(chunks):  # a step running both a prefill chunk and a decode token
            nonlocal mixed_steps
            mixed_steps += any(c.num_tokens > 1 for c in chunks) and any(
                c.num_tokens == 1 and c.start_pos > 0 and not c.is_last_prefill_chunk for c in chunks)

        engine.on_step = count_mixed
        for step in range(60):
            if step < 40 and torch.rand(1, generator=rng).item() < 0.5:
                rid = f"q{step}"
                n = int(torch.randint(1, 20, (1,), generator=rng))
                engine.add_request(rid, torch.randint(0, 256, (n,), generator=rng).tolist(),
                                   SamplingParams(max_tokens=int(torch.randint(1, 10, (1,), generator=rng))))
                live.append(rid)
            if live and torch.rand(1, generator=rng).item() < 0.1:
                engine.abort(live.pop(int(torch.randint(0, len(live), (1,), generator=rng))))
            outs = engine.step()
            live = [r for r in live if r not in {o.request_id for o in outs if o.finished}]
        while engine.has_unfinished():
            engine.step()
        assert engine.kv.num_free_pages == 24 and engine.allocator.owners() == []
        assert mixed_steps > 0  # prefill chunks and decodes did share steps


def test_a_request_over_the_models_context_is_refused_even_with_pages_to_spare():
    with LLMEngine(MODEL, EngineConfig(page_size=16, num_pages=600)) as engine:  # 9,600 tokens of pool
        assert engine.arch.max_context_tokens == 4096
        with pytest.raises(EngineError, match="model's context of 4096 tokens"):
            engine.check_prompt("long", [5] * 4000, SamplingParams(max_tokens=200))
        with pytest.raises(EngineError, match="KV pool"):
            LLMEngine(MODEL, EngineConfig(page_size=16, num_pages=8)).check_prompt(
                "pool", [5] * 100, SamplingParams(max_tokens=100))
        engine.check_prompt("fits", [5] * 3000, SamplingParams(max_tokens=1000))


def test_max_model_len_caps_requests_below_the_models_context():
    with LLMEngine(MODEL, EngineConfig(page_size=16, num_pages=600, max_model_len=1024)) as engine:
        with pytest.raises(EngineError, match="model's context of 1024 tokens"):
            engine.check_prompt("long", [5] * 1000, SamplingParams(max_tokens=25))
        engine.check_prompt("fits", [5] * 1000, SamplingParams(max_tokens=24))
