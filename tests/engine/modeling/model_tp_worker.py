"""A tensor-parallel rank for the model tests, started with the spawn method (importable by the
child because spawn hands it the parent's sys.path)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from model_oracle import ContiguousAttention, make_batch

from disaggsdk.engine.modeling import build_model
from disaggsdk.engine.parallel import TensorParallel

PROMPT_LENGTHS = (9, 4)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    return [torch.randint(0, 512, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def two_steps(model, on_layer_done=None) -> torch.Tensor:
    """Logits of a batched prefill followed by one decode step (greedy tokens fed back)."""
    attn = ContiguousAttention()
    ps = prompts()
    batch = make_batch(ps, [0, 0], on_layer_done)
    attn.plan(batch)
    with torch.no_grad():
        first = model.compute_logits(model(batch, attn))
        ends = torch.tensor(PROMPT_LENGTHS).cumsum(0) - 1
        nxt = first[ends].argmax(-1).tolist()
        batch = make_batch([[t] for t in nxt], list(PROMPT_LENGTHS), on_layer_done)
        attn.plan(batch)
        second = model.compute_logits(model(batch, attn))
    return torch.cat([first, second])


def run_rank(rank: int, world_size: int, port: int, models: list[str], out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        tp = TensorParallel(rank=rank, size=world_size)
        for i, model in enumerate(models):
            seen: list[int] = []
            logits = two_steps(build_model(model, tp), lambda layer, _out, seen=seen: seen.append(layer))
            torch.save({"logits": logits, "seen": seen}, Path(out_dir) / f"{i}.rank{rank}.pt")
    finally:
        dist.destroy_process_group()
