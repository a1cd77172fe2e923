"""The model's step under `torch.compile` on CPU, streaming included (the CPU twin of
`engine.compiled_step.cuda_graphs`).

Inductor compiles everything between the attention backend's ``plan`` and the logits; attention and the
layer counter stay custom ops (`engine.graph_ops`), so layer-by-layer KV streaming works unchanged.
Three dynamic-shape graphs (one token, up to `skinny.MAX_ROWS`, longer), and DeepSeek's MTP layer
compiled the same way (`mtp_draft`).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType
from typing import TYPE_CHECKING, Literal

import torch

from disaggsdk.engine.graph_ops import GraphAttention, GraphLayerCounter
from disaggsdk.engine.layer_counter.host import LayerCounter

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import AttentionBackend
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.forward_batch import ForwardBatch
    from disaggsdk.engine.modeling.base import DraftLayer
    from disaggsdk.engine.modeling.layers.decoder import DecoderModel

MAX_GRAPHS = 64  # compiled graphs of the step kept per process (three per engine)


class CompiledStep:
    """``model.forward_tokens`` compiled, with attention and the layer counter as graph ops.

    Args:
        model: a `DecoderModel` of a single rank (no tensor-parallel collectives in the graph).
        backend: the rank's attention backend: `__call__` plans it for each batch; `forward` and
            `mtp_draft` run it as the caller planned it.
    """

    @classmethod
    def for_rank(cls, model: DecoderModel, backend: AttentionBackend, engine: EngineConfig,
                 on_layer_done: Callable[[int, torch.Tensor], None] | None) -> CompiledStep:
        """The registry's constructor (`disaggsdk.engine.compiled_step.new_compiled_step`): the
        graphs are specialised on ``on_layer_done`` when they compile (`background_compile`), not here."""
        return cls(model, backend)

    def __init__(self, model: DecoderModel, backend: AttentionBackend):
        self.model = model
        self.attn = GraphAttention(backend)
        self._counters: dict[int, GraphLayerCounter] = {}
        # Dynamo keeps the graphs of `_trace` per code object, guarded on the model: every engine
        # of a process adds three. Past the limit (8 by default) it would run the step eagerly.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, MAX_GRAPHS)
        self._forward = torch.compile(self._trace, dynamic=True)
        self._mtp_layer = model.draft_layer()
        self._mtp_draft = torch.compile(self._trace_mtp_draft, dynamic=True)

    def _trace(self, input_ids: torch.Tensor, positions: torch.Tensor,
               counter: GraphLayerCounter | None) -> torch.Tensor:
        return self.model.forward_tokens(input_ids, positions, self.attn, counter)

    def _trace_mtp_draft(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                         rows: torch.Tensor, counter: GraphLayerCounter | None) -> tuple[torch.Tensor, torch.Tensor]:
        return self._draft_layer().draft(hidden, next_ids, positions, self.attn, rows, counter)

    def _draft_layer(self) -> DraftLayer:
        assert self._mtp_layer is not None, "mtp_draft on a model without an MTP layer"
        return self._mtp_layer

    def _graph_counter(self, callback: Callable[[int, torch.Tensor], None] | None,
                       ) -> GraphLayerCounter | None | Literal[False]:
        """The graph op for an engine's `LayerCounter` callback (its bound ``on_layer_done``); None
        for none; False for any other callable (only eager code can call it)."""
        if callback is None:
            return None
        owner = callback.__self__ if isinstance(callback, MethodType) else None
        if not isinstance(owner, LayerCounter):
            return False
        counter = self._counters.get(id(owner))
        if counter is None:
            counter = self._counters[id(owner)] = GraphLayerCounter(owner)
        return counter

    def mtp_draft(self, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
                  on_layer_done: Callable[[int, torch.Tensor], None] | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """``model.draft_layer().draft(...)`` (the backend planned for these rows) in one compiled call."""
        counter = self._graph_counter(on_layer_done)
        if counter is False:
            return self._draft_layer().draft(hidden, next_ids, positions, self.attn.backend, rows, on_layer_done)
        with torch.inference_mode():  # see forward
            return self._mtp_draft(hidden, next_ids.clone(), positions.clone(), rows.clone(), counter)

    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether the graphs can hold ``batch``'s layer callback: none, or a `LayerCounter`'s
        (any other callable runs Python only eager code can call)."""
        return self._graph_counter(batch.on_layer_done) is not False

    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        """The backend planned for ``batch``, then `forward`; the backend stays planned for it (the
        MTP layer reads that plan)."""
        if batch.num_tokens:  # an idle lock-step rank's empty batch has nothing to plan (engine.dp_lockstep)
            self.attn.backend.plan(batch)
        return self.forward(batch)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states after the final norm for a ``batch`` the backend is planned for (as
        ``model(batch, backend)``)."""
        counter = self._graph_counter(batch.on_layer_done)
        if counter is False:
            return self.model(batch, self.attn.backend)  # an arbitrary callback: only eager can call it
        with torch.inference_mode():
            # inputs made inside or outside inference mode differ in dispatch keys, and the graph is
            # guarded on them: copies made here (a few ints per token) are always inference tensors
            return self._forward(batch.input_ids.clone(), batch.positions.clone(), counter)
