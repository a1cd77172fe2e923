"""One rank of an expert-parallel gloo group that runs engine steps' worth of dispatch and combine
the way the engine's scheme does (disaggsdk.sim.all_to_all's module doc) and saves what its
dispatcher counted (started with spawn: importable by the child because spawn hands it the
parent's sys.path). Every rank draws every dp group's tokens from the same seeds and dispatches
its own tp slice of its group's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import torch.distributed as dist

from disaggsdk.engine.expert_parallel import ExpertMap, create_dispatcher
from disaggsdk.models import resolve_model

MODEL = "deepseek-r1-tiny"  # 8 routed experts, top 2, 3 MoE layers after 1 dense, one MTP layer
TOKENS_PER_DP_GROUP = 4096  # divisible by every tp here, so every rank dispatches num_tokens / ep
NUM_MTP_PASSES = 1  # each step runs the MTP layer once too: one more MoE layer


def shapes(ep: int) -> list[tuple[int, int]]:
    """Every (tp, dp) with tp * dp == ep, dp 1 (ep == tp, a prefill instance) included."""
    return [(tp, ep // tp) for tp in range(1, ep + 1) if ep % tp == 0]


def cases(ep: int) -> list[tuple[str, int, int]]:
    """(routing, tp, dp) of every step the group runs: uniform and the model's router at every shape, and
    uniform with dp group 0 idle where there are several dp groups."""
    out = [(routing, tp, dp) for tp, dp in shapes(ep) for routing in ("uniform", "router")]
    return out + [("uniform_group0_idle", tp, dp) for tp, dp in shapes(ep) if dp > 1]


def group_tokens(case: str, dp_rank: int) -> int:
    """Tokens dp group ``dp_rank`` runs in a step of ``case``."""
    return 0 if case == "uniform_group0_idle" and dp_rank == 0 else TOKENS_PER_DP_GROUP


def _uniform_ids(gen: torch.Generator, num_tokens: int, num_experts: int, top_k: int) -> torch.Tensor:
    """[num_tokens, top_k] int64: distinct experts per token, each slot uniform over all experts."""
    return torch.rand(num_tokens, num_experts, generator=gen).topk(top_k, dim=-1).indices


def run_rank(rank: int, ep: int, port: int, out_dir: str) -> None:
    """Run every case of `cases` as one step on this rank; save the dispatcher's count of each step."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ep)
    try:
        from disaggsdk.engine.modeling import build_model
        from disaggsdk.engine.parallel import TensorParallel

        arch = resolve_model(MODEL)
        model = build_model(MODEL, TensorParallel())  # every rank the same full router weights (seeded)
        moe_gates = [layer.mlp.gate for layer in model.layers[arch.first_k_dense:]]
        moe_gates += [model.mtp[0].block.mlp.gate] * NUM_MTP_PASSES
        expert_map = ExpertMap(arch.num_experts, ep)
        dispatcher = create_dispatcher("all_to_all", expert_map, rank)
        results = []
        for index, (case, tp, dp) in enumerate(cases(ep)):
            dp_rank, tp_rank = divmod(rank, tp)  # instance rank = dp_rank * tp + tp_rank
            num_tokens = group_tokens(case, dp_rank)
            start, stop = num_tokens * tp_rank // tp, num_tokens * (tp_rank + 1) // tp
            before = dispatcher.counters.copy()
            for layer, gate in enumerate(moe_gates):
                # the same tokens and routing on every tp rank of a dp group, as after the attention all-reduce
                gen = torch.Generator().manual_seed(1000 * index + 10 * dp_rank + layer)
                hidden = torch.randn(num_tokens, arch.hidden_size, generator=gen)
                if case == "router":
                    with torch.inference_mode():
                        weights, ids = gate(hidden)
                else:
                    ids = _uniform_ids(gen, num_tokens, arch.num_experts, arch.num_experts_per_tok)
                    weights = torch.full(ids.shape, 1.0 / ids.shape[1])
                received = dispatcher.dispatch(hidden[start:stop], ids[start:stop], weights[start:stop])
                # what the experts compute does not change what moves; combine returns the rows as they came
                combined = dispatcher.combine(received.hidden.clone(), received.handle)
                assert combined.shape == (stop - start, arch.hidden_size)
            results.append({"case": case, "tp": tp, "dp": dp, "rows_dispatched_per_layer": stop - start,
                            "counters": dataclasses.asdict(dispatcher.counters.since(before))})
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
