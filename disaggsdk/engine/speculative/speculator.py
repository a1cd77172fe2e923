"""The engine's speculative decoding: drafts before a step (n-gram) or after it (MTP), verified by
`engine.step_outputs` against the target's logits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from disaggsdk.engine.config import EngineConfig, EngineError
from disaggsdk.engine.forward_batch import ForwardBatch
from disaggsdk.engine.scheduler import ScheduledChunk
from disaggsdk.engine.sequence import Request
from disaggsdk.engine.speculative.config import SpeculativeConfig
from disaggsdk.engine.speculative.mtp_drafter import DraftSlot, MTPDrafter, MTPMirror, next_token_ids
from disaggsdk.engine.speculative.ngram import propose_ngram
from disaggsdk.engine.speculative.stats import SpecStats
from disaggsdk.kv.page_allocator import PageAllocator

if TYPE_CHECKING:
    from disaggsdk.engine.compiled_step.torch_compile import CompiledStep
    from disaggsdk.engine.model_runner import ModelRunner
    from disaggsdk.models.arch import ModelArch


class Speculator:
    """Proposes each decoding request's drafts and counts what verification accepts.

    Args:
        config: the method and the drafts per step.
        mtp_drafter: the MTP layer's runner (method "mtp"), else None.
    """

    def __init__(self, config: SpeculativeConfig, mtp_drafter: MTPDrafter | None = None):
        self.config = config
        self.mtp = mtp_drafter
        self.stats = SpecStats()

    def use_compiled(self, step: CompiledStep | None) -> None:
        """The rank's step compiled (`LLMEngine`, once its background compile ended): the MTP layer
        drafts through it from now on."""
        if self.mtp is not None:
            self.mtp.rank_pass.compiled = step

    def draft_budget(self, req: Request) -> int:
        """Drafts worth proposing: never more than the tokens the request may still emit, minus the
        target's own token of the step."""
        return max(0, min(self.config.num_tokens, req.params.max_tokens - len(req.output_ids) - 1))

    def before_schedule(self, running: Sequence[Request], target_tokens: Callable[[Request], int]) -> None:
        """n-gram: draft for every request whose next step is a decode step."""
        if self.config.method != "ngram":
            return
        c = self.config
        for req in running:
            if target_tokens(req) - req.num_computed_tokens == 1:
                req.draft_ids = propose_ngram(req.all_ids, self.draft_budget(req), c.prompt_lookup_min,
                                              c.prompt_lookup_max)

    def after_step(self, batch: ForwardBatch, hidden_all: torch.Tensor, chunks: Sequence[ScheduledChunk],
                   on_layer_done: Callable[[int, torch.Tensor], None] | None = None) -> None:
        """MTP: run the layer over the step (its KV for every computed position) and draft for every
        request that got a token and goes on. Call after the requests were advanced.
        ``on_layer_done``: the engine's layer counter (a prefill unit streams the MTP layer's KV
        when it fires for layer ``num_layers``)."""
        if self.mtp is None:
            return
        next_ids = next_token_ids([c.request for c in chunks], [c.start_pos for c in chunks],
                                  [c.num_tokens for c in chunks])
        slots, first_row = [], 0
        for c in chunks:
            req = c.request
            budget = self.draft_budget(req)
            if c.sample and not req.is_finished and budget:
                slots.append(DraftSlot(req, first_row + req.num_computed_tokens - 1 - c.start_pos, budget))
            first_row += c.num_tokens
        by_id = {s.request.request_id: s.request for s in slots}
        for req_id, drafts in self.mtp.run(batch, hidden_all, next_ids, slots, on_layer_done).items():
            by_id[req_id].draft_ids = drafts


def mtp_drafts(config: EngineConfig) -> bool:
    """Whether an engine of ``config`` drafts with the MTP layer (its KV pool then has its layer)."""
    return config.speculative is not None and config.speculative.method == "mtp"


def check_speculative(arch: ModelArch, config: EngineConfig) -> None:
    """Refuse speculative settings this engine cannot run, saying what to change.

    Raises:
        EngineError: MTP on a model without an MTP layer, or speculation on an engine that neither
            decodes (mode "mixed") nor fills the MTP layer's KV (a prefill_only engine with mtp).
    """
    spec = config.speculative
    if spec is None:
        return
    if spec.method == "mtp" and not arch.num_mtp_layers:
        raise EngineError(f"{arch.name} has no MTP layer (num_nextn_predict_layers is 0): use speculative "
                          f"method 'ngram', or a DeepSeek-V3-style checkpoint with its MTP weights")
    if config.mode == "decode_only" or (config.mode == "prefill_only" and spec.method != "mtp"):
        raise EngineError(f"speculative method {spec.method!r} does not run in a {config.mode} engine (a prefill "
                          f"engine only fills the MTP layer's KV; decode engines are mixed)")


def new_speculator(config: EngineConfig, runner: ModelRunner, allocator: PageAllocator,
                   mirror: MTPMirror | None = None, lockstep: bool = False) -> Speculator | None:
    """The engine's `Speculator` (None without speculation); ``mirror``: the tp workers (tp > 1);
    ``lockstep``: the engine is a rank of a lock-step dp group (its MTP calls per step are fixed).

    Raises:
        EngineError: method "mtp" on a checkpoint whose MTP weights are missing.
    """
    spec = config.speculative
    if spec is None:
        return None
    drafter = None
    if spec.method == "mtp":
        if runner.model.draft_layer() is None:
            raise EngineError(f"{runner.config.model}: the checkpoint has no MTP weights (model.layers."
                              f"{runner.model.arch.num_layers}.*): use speculative method 'ngram'")
        # no compiled step yet: the engine compiles after it made the speculator, and hands the
        # compiled step over once it adopted it (`Speculator.use_compiled`)
        drafter = MTPDrafter(runner.model, runner.attn, allocator, config.page_size, runner.device, mirror,
                             lockstep_chains=spec.num_tokens - 1 if lockstep else None)
    return Speculator(spec, drafter)

