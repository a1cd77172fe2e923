"""One dp rank of an expert-parallel engine group for tests/engine/test_expert_parallel_engine.py,
and the pieces the test process shares with it (the routing patch, the tp 1 reference).

A rank runs in a process of its own (started with the spawn method: importable by the child because
spawn hands it the parent's sys.path), builds an `LLMEngine` that joins the group, runs its share
of the work and writes what it saw to ``out_dir/rank{dp_rank}.json``; the test compares the files
with a tp 1 engine's tokens. Nothing is asserted here: a rank that raises exits non-zero, and the
test says which.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
from torch import nn

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.modeling.layers.moe import Experts, GroupLimitedRouter, SoftmaxTopKRouter
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.engine.speculative.config import SpeculativeConfig

# a router's forward: (module, x [T, hidden_size]) -> (topk_weights [T, k] float32, topk_ids [T, k] int64)
RouterForward = Callable[..., tuple[torch.Tensor, torch.Tensor]]
NUM_PAGES = 64  # of each rank's KV pool: room for every test's prompts and tokens


@dataclasses.dataclass(frozen=True)
class Add:
    """Add request ``request_id`` before the rank's step number ``before_step`` (0: the first)."""

    before_step: int
    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int


@dataclasses.dataclass(frozen=True)
class Abort:
    """Abort ``request_ids`` before the rank's step number ``before_step``."""

    before_step: int
    request_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Stop:
    """Set the engine's ``stopping`` before the rank's step number ``before_step`` (a unit told to stop)."""

    before_step: int


@dataclasses.dataclass(frozen=True)
class GroupJob:
    """What every rank of one group runs.

    ``prompts[r]`` are rank r's (prompt, max_tokens) pairs, run with ``LLMEngine.generate`` (a rank
    with none calls it with none, as the group needs); ``events`` instead drives the ranks with
    `LLMEngine.step` in a loop, ``events[r]`` being rank r's `Add` / `Abort` / `Stop` list.
    """

    model: str
    tp: int
    dp_size: int
    prompts: tuple[tuple[tuple[tuple[int, ...], int], ...], ...] = ()
    events: tuple[tuple[Add | Abort | Stop, ...], ...] = ()
    mtp: bool = False  # MTP speculative decoding, two drafts (models with an MTP layer)
    route_to_expert: int | None = None  # `route_every_token_to` this expert in every MoE layer

    def __post_init__(self) -> None:
        if self.route_to_expert is not None and self.tp > 1:
            # the patch lives in the rank's process; the tp workers its engine spawns would route as the model does
            raise ValueError("route_to_expert needs tp=1: an engine's tp workers do not inherit the routing patch")

    @property
    def ep(self) -> int:
        """The experts spread over every rank of the group: tp x dp_size."""
        return self.tp * self.dp_size


def greedy(max_tokens: int) -> SamplingParams:
    """The sampling every test uses: greedy, exactly ``max_tokens`` tokens (eos does not end it)."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def speculative(mtp: bool) -> SpeculativeConfig | None:
    """MTP drafting with two drafts per step when ``mtp``, else none."""
    return SpeculativeConfig("mtp", 2) if mtp else None


@contextlib.contextmanager
def route_every_token_to(expert: int | None) -> Iterator[None]:
    """Make both routers (Qwen3-MoE's and DeepSeek-V3's) send every token's top-k slots to
    ``expert``, keeping their weights; None: leave them alone. The class's forward is patched, so
    every MoE layer of every engine this process builds while inside follows it."""
    if expert is None:
        yield
        return
    routers: tuple[type[nn.Module], ...] = (SoftmaxTopKRouter, GroupLimitedRouter)
    originals: dict[type[nn.Module], RouterForward] = {cls: cls.forward for cls in routers}

    def routed(original: RouterForward) -> RouterForward:
        def forward(self: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            weights, ids = original(self, x)
            return weights, torch.full_like(ids, expert)  # the router's weights, one expert for every slot
        return forward

    for cls, original in originals.items():
        cls.forward = routed(original)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.forward = original  # type: ignore[method-assign]


def reference_tokens(model: str, prompts: Sequence[tuple[tuple[int, ...], int]], mtp: bool,
                     route_to_expert: int | None = None) -> tuple[list[list[int]], dict[str, int]]:
    """A tp 1 engine's greedy tokens of every (prompt, max_tokens), in order, and its draft counts."""
    config = EngineConfig(num_pages=NUM_PAGES, compile=False, speculative=speculative(mtp))
    with route_every_token_to(route_to_expert), LLMEngine(model, config) as engine:
        outputs = engine.generate([list(p) for p, _ in prompts], [greedy(n) for _, n in prompts])
        stats = engine.spec_stats
    return [o.output_ids for o in outputs], {"num_drafts": stats.num_drafts,
                                            "num_accepted_tokens": stats.num_accepted_tokens}


def experts_held(engine: LLMEngine) -> list[dict[str, object]]:
    """Per MoE layer of this rank (the MTP layer's included): the experts its plan names, the
    experts its parameters hold, and the expert numbers of the checkpoint tensors it loads."""
    slot_names = [slot.name for slot in engine.runner.model.weight_slots()]
    layers = []
    for module in engine.runner.model.modules():
        if not isinstance(module, Experts):
            continue
        loaded = {int(name[len(module.prefix):].split(".")[0]) for name in slot_names if name.startswith(module.prefix)}
        layers.append({"prefix": module.prefix, "num_experts": module.num_experts, "held": list(module.held),
                       "w13_experts": module.w13.shape[0], "w2_experts": module.w2.shape[0],
                       "checkpoint_experts": sorted(loaded)})
    return layers


def run_dp_rank(dp_rank: int, job: GroupJob, group_address: str, out_dir: str) -> None:
    """Be dp rank ``dp_rank`` of ``job``'s group until the group has no work; write what it saw."""
    torch.set_num_threads(1)  # the ranks share two cores
    config = EngineConfig(
        tp=job.tp, ep=job.ep, dp_rank=dp_rank, dp_size=job.dp_size,
        group_address=group_address if job.dp_size > 1 else None,
        num_pages=NUM_PAGES, compile=False, speculative=speculative(job.mtp),
    )
    with route_every_token_to(job.route_to_expert), LLMEngine(job.model, config) as engine:
        # the head's own parameters in detail, and every rank's (tp workers' too) as each reported at start
        result: dict[str, object] = {"dp_rank": dp_rank, "experts": experts_held(engine),
                                     "held_lines": engine.held_experts()}
        if job.prompts:
            mine = job.prompts[dp_rank]
            outputs = engine.generate([list(p) for p, _ in mine], [greedy(n) for _, n in mine])
            result["tokens"] = [o.output_ids for o in outputs]
        else:
            result.update(_run_events(engine, job.events[dp_rank]))
        stats = engine.spec_stats
        lockstep = engine.lockstep
        dispatcher = next(m.dispatcher for m in engine.runner.model.modules() if isinstance(m, Experts))
        result.update({
            "num_drafts": stats.num_drafts, "num_accepted_tokens": stats.num_accepted_tokens,
            "num_idle_steps": lockstep.num_idle_steps if lockstep is not None else None,
            "num_votes": lockstep.num_votes if lockstep is not None else None,
            "has_unfinished": engine.has_unfinished(),
            "counters": dataclasses.asdict(dispatcher.counters) if dispatcher is not None else None,
        })
    (Path(out_dir) / f"rank{dp_rank}.json").write_text(json.dumps(result))


def _run_events(engine: LLMEngine, events: Sequence[Add | Abort | Stop]) -> dict[str, object]:
    """Drive the engine with `step` as a serving loop does, adding and aborting as ``events`` say.

    Every rank leaves at the first vote that finds no work on any rank (``group_idle``), or that
    finds one stopping (``group_stopped``, after which `must_step` is False): they all take part in
    that vote, so they all leave after the same step and none waits for another. An event due
    after that step never happens (the result's ``num_events_done`` tells).
    """
    tokens: dict[str, list[int]] = {}
    last_output_step: dict[str, int] = {}
    finish_reasons: dict[str, str | None] = {}
    aborted: dict[str, bool] = {}
    num_events_done = 0
    num_steps = 0
    while engine.must_step():
        for event in events:
            if event.before_step != num_steps:
                continue
            num_events_done += 1
            if isinstance(event, Add):
                engine.add_request(event.request_id, list(event.prompt_ids), greedy(event.max_tokens))
            elif isinstance(event, Abort):
                aborted.update({rid: engine.abort(rid) for rid in event.request_ids})
            else:
                engine.stopping = True
        outputs = engine.step()
        num_steps += 1
        for out in outputs:
            tokens[out.request_id] = list(out.output_ids)
            last_output_step[out.request_id] = num_steps - 1
            if out.finished:
                finish_reasons[out.request_id] = out.finish_reason
        if engine.group_idle:
            break
    return {"group_stopped": engine.group_stopped,
            "step_tokens": tokens, "last_output_step": last_output_step, "finish_reasons": finish_reasons,
            "aborted": aborted, "num_events_done": num_events_done, "num_steps": num_steps}
