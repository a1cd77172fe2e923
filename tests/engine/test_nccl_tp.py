"""Tensor parallelism over NCCL (tp=2, one GPU per rank) gives the CPU tp=1 model's numbers in float32: the
models' logits through their all-reduces and all-gathers, and an engine's greedy tokens (`engine.tp_group`
puts tp rank r on cuda:r). NCCL will not put two ranks of one group on one GPU, so these need 2 GPUs. The
same rank code on gloo over CPU tensors is its twin (slow; make test-all)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from nccl_tp_worker import DTYPE, prefill_then_decode, run_rank  # noqa: E402

from disaggsdk.engine.config import EngineConfig  # noqa: E402
from disaggsdk.engine.llm_engine import LLMEngine  # noqa: E402
from disaggsdk.engine.modeling import build_model  # noqa: E402
from disaggsdk.engine.parallel import TensorParallel  # noqa: E402
from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from tests.declared_skips import no_gpu  # noqa: E402
from tests.spawned_ranks import free_port, run_ranks  # noqa: E402

# GQA with KV heads split, GQA with experts split, MLA with its latent replicated
MODELS = ["qwen3-tiny", "qwen3-coder-tiny", "deepseek-r1-tiny"]
# the trained checkpoint: its greedy choices have margins that float32 rounding does not flip
TRAINED = "qwen3-coder-tiny"
PROMPTS = [[482, 294, 1474, 14, 84, 312], [506, 1338, 491, 32], [7] * 19]
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


def needs_two_gpus() -> None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        pytest.skip(no_gpu(f"needs 2 GPUs (this machine has {count}): NCCL will not put two ranks of one group on one GPU"))


def tp2_logits(tmp_path, backend: str, models: list[str]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each model's (rank 0, rank 1) logits from two spawned ranks on ``backend``."""
    run_ranks(run_rank, 2, (2, free_port(), models, str(tmp_path), backend))
    return [(torch.load(tmp_path / f"{i}.rank0.pt"), torch.load(tmp_path / f"{i}.rank1.pt")) for i in range(len(models))]


def assert_equals_tp1(models: list[str], logits: list[tuple[torch.Tensor, torch.Tensor]], tolerance: float) -> None:
    for name, (rank0, rank1) in zip(models, logits):
        expected = prefill_then_decode(build_model(name, TensorParallel(), dtype=DTYPE), "cpu")
        torch.testing.assert_close(rank0, expected, atol=tolerance, rtol=tolerance, msg=lambda m, n=name: f"{n}: {m}")
        # after the all-reduce every rank holds the same numbers
        torch.testing.assert_close(rank1, rank0, atol=0, rtol=0)
        if name == TRAINED:
            assert torch.equal(rank0.argmax(-1), expected.argmax(-1)), name


@pytest.mark.slow
def test_the_ranks_on_gloo_give_tp1_logits(tmp_path):
    """The twin on CPU: the same rank code, two processes over gloo, the trained model (slow: the default
    run has gloo tp=2 against tp=1 in tests/engine/modeling/test_models_tp.py)."""
    assert_equals_tp1([TRAINED], tp2_logits(tmp_path, "gloo", [TRAINED]), 1e-4)


@pytest.mark.gpu
def test_nccl_tp2_logits_equal_the_cpu_tp1_model(tmp_path):
    needs_two_gpus()
    # GPU float32 against CPU float32 (TF32 off): the tolerance of tests/engine/modeling/test_models_gpu.py
    assert_equals_tp1(MODELS, tp2_logits(tmp_path, "nccl", MODELS), 1e-3)


@pytest.mark.gpu
def test_an_nccl_tp2_engine_gives_the_cpu_engines_greedy_tokens(monkeypatch):
    needs_two_gpus()
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    common = dict(page_size=4, num_pages=64, max_num_batched_tokens=16, dtype=DTYPE, compile=False)
    with LLMEngine(TRAINED, EngineConfig(**common)) as cpu:
        want = [o.output_ids for o in cpu.generate(PROMPTS, PARAMS)]
    # the torch reference attention: FlashInfer has no float32 prefill kernels, and NCCL is what is under test
    engine = LLMEngine(TRAINED, EngineConfig(tp=2, device="cuda", attention_backend="torch_ref", **common))
    procs = list(engine._tp_group.procs)
    try:
        assert [o.output_ids for o in engine.generate(PROMPTS, PARAMS)] == want
    finally:
        engine.close()
    assert procs and all(not p.is_alive() for p in procs)
