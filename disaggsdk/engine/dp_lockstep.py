"""Data-parallel attention in lock-step: the dp ranks of one expert-parallel instance step together.

Each dp rank is an engine of its own (its scheduler, KV pages, prefix cache and requests), but
every MoE layer exchanges tokens with all ranks (engine.expert_parallel), so no rank may run a
step the others do not. Before each step the dp heads vote: the group steps when any rank has
work, and a rank without any runs an empty batch (its MoE layers dispatch no rows but take part
in every exchange: SGLang's DP attention pads the same way). A rank that is stopping says so in
the same vote, and the whole group stops: without one of its ranks no MoE layer can run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


@dataclass(frozen=True)
class StepVote:
    """What the dp heads agreed for the next step."""

    run: bool  # some rank has work: every rank steps (an idle one with an empty batch)
    stop: bool  # some rank is stopping: every rank leaves its loop


class DataParallelLockstep:
    """A dp head's side of the vote over the heads' process group (gloo, made by `tp_group.join_groups`).

    Args:
        group: the dp heads' group.
        dp_rank: this head's rank in it.
        dp_size: the group's size.
    """

    def __init__(self, group: ProcessGroup, dp_rank: int, dp_size: int):
        self.group = group
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.num_votes = 0
        self.num_idle_steps = 0  # steps this rank ran with an empty batch because another had work
        self.idle_votes_in_a_row = 0  # votes since the group last had work (a loop may poll slower then)

    def vote(self, has_work: bool, stopping: bool) -> StepVote:
        """Collective over the heads: every head calls it once per round of its loop.

        Args:
            has_work: this rank scheduled something for its next step.
            stopping: this rank is leaving (told to stop).
        Returns:
            The group's `StepVote` (the maximum of every head's flags).
        """
        flags = torch.tensor([int(has_work), int(stopping)], dtype=torch.int32)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        self.num_votes += 1
        run, stop = (bool(v) for v in flags.tolist())
        if run and not has_work and not stop:
            self.num_idle_steps += 1
        self.idle_votes_in_a_row = 0 if run else self.idle_votes_in_a_row + 1
        return StepVote(run=run and not stop, stop=stop)
