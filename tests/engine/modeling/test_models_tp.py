"""tp=2 across two real processes (gloo) gives the logits of tp=1, for loaded checkpoints (heads
split, a single KV head replicated, MLA latent replicated, experts split) and random tiny models."""

from __future__ import annotations

import socket

import torch
import torch.multiprocessing as mp
from model_tp_worker import run_rank, two_steps

from disaggsdk.engine.modeling import build_model
from disaggsdk.engine.parallel import TensorParallel
from tests.hf_checkpoints import save_hf_checkpoint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tp2_logits_equal_tp1(tmp_path):
    models = []
    for name, overrides in [
        ("qwen3-tiny", {}),
        ("qwen3-tiny", {"num_key_value_heads": 1}),  # tp=2 > kv heads: the head is replicated
        ("qwen3-coder-tiny", {}),
        ("deepseek-r1-tiny", {}),
    ]:
        directory = tmp_path / f"{name}-{len(models)}"
        save_hf_checkpoint(name, directory, **overrides)
        models.append(str(directory))
    models += ["qwen3-coder-tiny", "deepseek-r1-tiny"]  # seeded random: same full model at any tp

    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=run_rank, args=(r, 2, port, models, str(tmp_path))) for r in range(2)]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=240)
        assert [p.exitcode for p in procs] == [0, 0]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()

    for i, model in enumerate(models):
        expected = two_steps(build_model(model, TensorParallel()))
        rank0 = torch.load(tmp_path / f"{i}.rank0.pt")
        rank1 = torch.load(tmp_path / f"{i}.rank1.pt")
        torch.testing.assert_close(rank0["logits"], expected, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(rank1["logits"], rank0["logits"], atol=0, rtol=0)
        num_layers = build_model(model, TensorParallel()).arch.num_layers
        assert rank0["seen"] == list(range(num_layers)) * 2  # two steps, head rank only
        assert rank1["seen"] == []
