"""Expert parallelism: the routed experts of a MoE layer spread over ranks, and the token exchange.

`ExpertMap` places experts on ranks (one definition with the memory plan's `expert_range`);
`ExpertDispatcher` (base.py) is the dispatch / combine contract; `torch_ref.ReferenceDispatch`
simulates a whole group in one process and is the oracle; ``all_to_all`` is
`torch.distributed.all_to_all_single` over a gloo (CPU) or NCCL (GPU) group. A fused GPU
kernel (DeepEP, pplx-kernels) would be one more registry entry.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from disaggsdk.engine.expert_parallel.base import AllToAllCounters, DispatchedTokens, DispatchHandle, ExpertDispatcher
from disaggsdk.engine.expert_parallel.expert_map import ExpertMap
from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

__all__ = ["DISPATCHERS", "AllToAllCounters", "DispatchHandle", "DispatchedTokens", "ExpertDispatcher",
           "ExpertMap", "ExpertParallelError", "create_dispatcher"]

# name -> "module:class"; each takes (expert_map, ep_rank, group, device)
DISPATCHERS = {
    "all_to_all": "disaggsdk.engine.expert_parallel.all_to_all:AllToAllDispatcher",
}


class ExpertParallelError(DisaggError):
    """An expert dispatcher is unknown or cannot run here."""


def create_dispatcher(name: str, expert_map: ExpertMap, ep_rank: int, group: ProcessGroup | None = None,
                      device: torch.device | str = "cpu") -> ExpertDispatcher:
    """Build the dispatcher ``name`` for this rank of an expert-parallel group.

    Args:
        name: a key of ``DISPATCHERS``.
        expert_map: where the experts live.
        ep_rank: this process's rank in ``group``.
        group: the expert-parallel process group; None means the default group.
        device: where the tokens live.
    Returns:
        The dispatcher.
    Raises:
        ExpertParallelError: unknown name.
    """
    if name not in DISPATCHERS:
        raise ExpertParallelError(f"unknown expert dispatcher {name!r}; use one of {sorted(DISPATCHERS)}")
    module_name, cls_name = DISPATCHERS[name].split(":")
    dispatcher: ExpertDispatcher = getattr(importlib.import_module(module_name), cls_name)(
        expert_map, ep_rank, group, device)
    return dispatcher
