"""One rank of the NCCL tensor-parallel model test (tests/engine/test_nccl_tp.py), started with the spawn
method (importable by the child because spawn hands it the parent's sys.path). The same rank runs on gloo
over CPU tensors, its twin on a machine without GPUs."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from disaggsdk.engine.modeling import build_model
from disaggsdk.engine.parallel import TensorParallel
from tests.engine.modeling.model_oracle import ContiguousAttention, make_batch

PROMPT_LENGTHS = (21, 6)
# what the ranks compute each model in: float32 is the dtype the CPU engine gives transformers' numbers in
DTYPE = "float32"


def prompts() -> list[list[int]]:
    """Two prompts of seeded token ids, the same in every process."""
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(0, 500, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]


def prefill_then_decode(model, device: str) -> torch.Tensor:
    """Logits of a batched prefill (every prompt token's) and one decode step of the prompts' greedy next
    tokens, on the CPU: [sum(PROMPT_LENGTHS) + len(PROMPT_LENGTHS), vocab_size], float32."""
    attn = ContiguousAttention()
    batch = make_batch(prompts(), [0, 0], device=device)
    attn.plan(batch)
    with torch.no_grad():
        first = model.compute_logits(model(batch, attn))
        last_rows = torch.tensor(PROMPT_LENGTHS).cumsum(0) - 1
        next_ids = first[last_rows.to(first.device)].argmax(-1).tolist()
        batch = make_batch([[t] for t in next_ids], list(PROMPT_LENGTHS), device=device)
        attn.plan(batch)
        second = model.compute_logits(model(batch, attn))
    return torch.cat([first, second]).float().cpu()


def run_rank(rank: int, world_size: int, port: int, models: list[str], out_dir: str, backend: str) -> None:
    """Join a ``backend`` group as ``rank`` (NCCL: on GPU ``rank``), run every model's two steps as that tp
    rank, and save its logits as ``{i}.rank{rank}.pt`` in ``out_dir``."""
    device = "cpu"
    if backend == "nccl":
        # one GPU per rank: NCCL refuses a group with two ranks on one device
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
        torch.backends.cuda.matmul.allow_tf32 = False  # IEEE float32 matmuls, as on the CPU
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        tp = TensorParallel(rank=rank, size=world_size)
        for i, name in enumerate(models):
            model = build_model(name, tp, dtype=DTYPE, device=device)
            torch.save(prefill_then_decode(model, device), Path(out_dir) / f"{i}.rank{rank}.pt")
    finally:
        dist.destroy_process_group()
