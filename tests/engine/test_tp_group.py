"""Tensor-parallel workers: same tokens as tp=1, gone after close, errors before any spawn."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.errors import ModelError

PROMPTS = [[1, 2, 3, 4, 5], [7] * 11, [300, 20]]
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def test_tp2_equals_tp1_and_workers_are_reaped():
    with LLMEngine("deepseek-r1-tiny", EngineConfig(page_size=4, num_pages=64, max_num_batched_tokens=8)) as one:
        want = [o.output_ids for o in one.generate(PROMPTS, PARAMS)]
    engine = LLMEngine("deepseek-r1-tiny", EngineConfig(tp=2, page_size=4, num_pages=64, max_num_batched_tokens=8))
    procs = list(engine._tp_group.procs)
    try:
        assert [o.output_ids for o in engine.generate(PROMPTS, PARAMS)] == want
        assert engine.kv.num_free_pages == 64
    finally:
        engine.close()
    assert procs and all(not p.is_alive() for p in procs)
    engine.close()  # idempotent


def test_tp_that_does_not_divide_fails_before_spawning():
    with pytest.raises(ModelError, match="tp=3"):
        LLMEngine("qwen3-tiny", EngineConfig(tp=3))


def test_a_dead_worker_is_an_error_not_a_hang():
    from disaggsdk.engine.tp_group import TensorParallelError

    engine = LLMEngine("qwen3-tiny", EngineConfig(tp=2, page_size=4, num_pages=32))
    procs = list(engine._tp_group.procs)
    try:
        procs[0].kill()
        procs[0].join(10)
        engine.add_request("a", [1, 2, 3], PARAMS)
        with pytest.raises(TensorParallelError, match="exited"):
            engine.step()
    finally:
        engine.close()
    assert all(not p.is_alive() for p in procs)


def test_an_idle_engine_outlives_the_collective_timeout(monkeypatch):
    """Workers wait for the next step without the collectives' timeout (it once killed a tp>1
    instance that had no request for 2 minutes)."""
    import time

    from disaggsdk.engine.tp_group import TPGroup

    monkeypatch.setattr(TPGroup.__init__, "__defaults__", (3.0,))  # collectives time out after 3 s
    engine = LLMEngine("qwen3-tiny", EngineConfig(tp=2, page_size=4, num_pages=32, compile=False))
    try:
        time.sleep(5)  # idle past it
        out = engine.generate([[1, 2, 3]], PARAMS)[0]
        assert len(out.output_ids) == PARAMS.max_tokens
    finally:
        engine.close()
