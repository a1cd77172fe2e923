"""The models on a CUDA device give the CPU model's logits (float32), and run in bfloat16."""

from __future__ import annotations

import pytest
import torch
from model_oracle import ContiguousAttention, make_batch

from disaggsdk.engine.modeling import build_model
from disaggsdk.engine.parallel import TensorParallel
from tests.declared_skips import no_gpu

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def need_cuda():
    if not torch.cuda.is_available():
        pytest.skip(no_gpu("needs an NVIDIA GPU"))


def logits(model, device):
    prompts = [[(7 * i + j) % 500 for j in range(n)] for i, n in enumerate((33, 8))]
    batch = make_batch(prompts, [0, 0], device=device)
    attn = ContiguousAttention()
    attn.plan(batch)
    with torch.no_grad():
        return model.compute_logits(model(batch, attn)).cpu()


@pytest.mark.parametrize("name", ["qwen3-tiny", "qwen3-coder-tiny", "deepseek-r1-tiny"])
def test_cuda_model_matches_cpu(name, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    cpu = logits(build_model(name, TensorParallel()), "cpu")
    gpu = logits(build_model(name, TensorParallel(), device="cuda"), "cuda")
    torch.testing.assert_close(gpu, cpu, atol=1e-3, rtol=1e-3)
    half = logits(build_model(name, TensorParallel(), dtype="bfloat16", device="cuda"), "cuda")
    assert torch.isfinite(half).all()
    assert (half.argmax(-1) == cpu.argmax(-1)).float().mean() > 0.5
