"""Routing scenarios for the expert dispatch tests, and one rank of an expert-parallel group that
runs them (started with the spawn method: importable by the child because spawn hands it the
parent's sys.path). Every rank builds every rank's inputs from the same seed and uses its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from disaggsdk.engine.expert_parallel import ExpertMap, create_dispatcher

HIDDEN_SIZE = 16
NUM_LAYERS = 2  # each scenario is dispatched and combined twice, as two MoE layers would


@dataclasses.dataclass
class Scenario:
    """Every rank's inputs of one dispatch."""

    expert_map: ExpertMap
    hidden: list[torch.Tensor]  # per rank [num_tokens_r, HIDDEN_SIZE]
    topk_ids: list[torch.Tensor]  # per rank [num_tokens_r, top_k] int64
    topk_weights: list[torch.Tensor]  # per rank [num_tokens_r, top_k] float32


def _route(gen: torch.Generator, num_tokens: int, allowed: list[int], top_k: int) -> torch.Tensor:
    """Distinct random experts per token, drawn from ``allowed``."""
    scores = torch.rand(num_tokens, len(allowed), generator=gen)
    return torch.tensor(allowed, dtype=torch.int64)[scores.topk(top_k, dim=-1).indices]


def scenario(name: str, ep: int) -> Scenario:
    """The inputs of scenario ``name`` for ``ep`` ranks (see SCENARIOS)."""
    # a seed every process computes alike (str hash is salted per process)
    gen = torch.Generator().manual_seed(sum(name.encode()) + ep)
    num_tokens = [5, 3, 7, 1][:ep] + [4] * max(0, ep - 4)
    dtype = torch.float32
    num_experts, top_k = 2 * ep, 2
    if name == "uneven_experts":  # ep does not divide the experts: the first ranks hold one more
        num_experts = 5 if ep == 2 else 6 if ep == 4 else 2 * ep + 1
    elif name == "fewer_experts_than_ranks":  # the last ranks hold none
        num_experts, top_k = max(1, ep - 1), 1
    elif name == "bfloat16":
        dtype = torch.bfloat16
    elif name == "no_tokens_anywhere":
        num_tokens = [0] * ep
    elif name == "one_rank_sends_nothing":
        num_tokens[min(1, ep - 1)] = 0
    expert_map = ExpertMap(num_experts, ep)
    every = list(range(num_experts))
    ids = []
    for rank, n in enumerate(num_tokens):
        if name == "every_token_to_one_expert":
            ids.append(torch.full((n, 1), num_experts - 1, dtype=torch.int64))
        elif name == "every_token_to_one_rank":
            ids.append(torch.tensor([[0, 1]] * n, dtype=torch.int64).reshape(n, 2))
        elif name == "one_rank_sends_nothing" and ep > 1:  # and the last rank's experts get no token
            start, _ = expert_map.expert_range(ep - 1)
            ids.append(_route(gen, n, every[:start], top_k))
        elif name == "only_local_experts":
            start, stop = expert_map.expert_range(rank)
            ids.append(_route(gen, n, every[start:stop], top_k))
        else:
            ids.append(_route(gen, n, every, top_k))
    hidden = [torch.randn(n, HIDDEN_SIZE, generator=gen).to(dtype) for n in num_tokens]
    weights = []
    for t in ids:
        w = torch.rand(t.shape, generator=gen) + 0.1
        weights.append(w / w.sum(dim=-1, keepdim=True))
    return Scenario(expert_map, hidden, ids, weights)


SCENARIOS = ("random", "uneven_experts", "fewer_experts_than_ranks", "every_token_to_one_expert",
             "every_token_to_one_rank", "one_rank_sends_nothing", "only_local_experts", "no_tokens_anywhere",
             "bfloat16")


def expert_weights(num_experts: int, dtype: torch.dtype) -> torch.Tensor:
    """[num_experts, HIDDEN_SIZE, HIDDEN_SIZE]: expert e is x -> tanh(x @ W[e].T)."""
    gen = torch.Generator().manual_seed(1234 + num_experts)
    return (torch.randn(num_experts, HIDDEN_SIZE, HIDDEN_SIZE, generator=gen) / HIDDEN_SIZE ** 0.5).to(dtype)


def run_local_experts(rows: torch.Tensor, local_ids: torch.Tensor, expert_map: ExpertMap, ep_rank: int) -> torch.Tensor:
    """What rank ``ep_rank``'s experts make of the rows it received (row by row, so the result does
    not depend on which other rows came along)."""
    start, _ = expert_map.expert_range(ep_rank)
    w = expert_weights(expert_map.num_experts, rows.dtype)
    out = torch.empty_like(rows)
    for i in range(rows.shape[0]):
        out[i] = torch.tanh(w[start + int(local_ids[i])] @ rows[i])
    return out


def dense_moe(hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The single-rank MoE every expert-parallel form must equal: sum_k weight x expert(token)."""
    w = expert_weights(num_experts, torch.float64)
    x = hidden.double()
    out = torch.zeros_like(x)
    for slot in range(topk_ids.shape[1]):
        y = torch.tanh(torch.einsum("toi,ti->to", w[topk_ids[:, slot]], x))
        out += topk_weights[:, slot, None].double() * y
    return out


def run_rank(rank: int, ep: int, port: int, out_dir: str, backend: str = "gloo") -> None:
    """Run every scenario on this rank and save what it received, combined and counted."""
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ep)
    try:
        results = {}
        for name in SCENARIOS:
            s = scenario(name, ep)
            dispatcher = create_dispatcher("all_to_all", s.expert_map, rank, device=device)
            layers = []
            for _ in range(NUM_LAYERS):
                before = dispatcher.counters.copy()
                tokens = dispatcher.dispatch(s.hidden[rank].to(device), s.topk_ids[rank].to(device),
                                             s.topk_weights[rank].to(device))
                expert_out = run_local_experts(tokens.hidden.cpu(), tokens.local_expert_ids.cpu(), s.expert_map, rank)
                combined = dispatcher.combine(expert_out.to(device), tokens.handle)
                layers.append({"hidden": tokens.hidden.cpu(), "local_expert_ids": tokens.local_expert_ids.cpu(),
                               "recv_splits": tokens.handle.recv_splits, "combined": combined.cpu(),
                               "counters": dataclasses.asdict(dispatcher.counters.since(before))})
            results[name] = {"layers": layers, "counters": dataclasses.asdict(dispatcher.counters)}
        try:  # a map for another group size is refused, not run into a hang
            create_dispatcher("all_to_all", ExpertMap(8, ep + 1), rank, device=device)
            results["wrong_size"] = "accepted"
        except ValueError as exc:
            results["wrong_size"] = str(exc)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
