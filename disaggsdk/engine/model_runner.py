"""One rank's model, KV cache and attention backend: run a `ForwardBatch`, return what is wanted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from disaggsdk.engine.attention import create_backend, default_backend
from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.forward_batch import ForwardBatch
from disaggsdk.engine.kv_cache import KVCache
from disaggsdk.engine.kv_scales import KVScales, read_kv_scales
from disaggsdk.engine.models import build_model, kv_geometry
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.memory.kv_layout import kv_dtype_name

if TYPE_CHECKING:
    from disaggsdk.engine.compiled_step import CompiledStep
    from disaggsdk.engine.cuda_graph_step import CudaGraphStep
    from disaggsdk.engine.models.base import KVGeometry
    from disaggsdk.memory.kv_layout import PoolMemory


@dataclass(frozen=True)
class RunnerConfig:
    """What a rank needs to build its part of the engine (picklable, sent to TP workers): the
    engine's settings (the KV pool's size and format, the model's dtype, device, seed and weights,
    the attention backend, where tp workers hand their pool over), and what the engine decided
    from them."""

    model: str
    engine: EngineConfig
    # compile the step: `engine.compile`, its unset resolved by the head (the environment's default);
    # only a rank of tp 1 does: torch.compile on a CPU (engine.compiled_step), CUDA graphs of its
    # decode steps on a GPU (engine.cuda_graph_step)
    compile: bool = False
    extra_kv_layers: int = 0  # KV layers after the model's own: the MTP layer's, when it drafts

    @property
    def kv_dtype(self) -> str:
        """The KV cache's element type: the engine's `kv_dtype`, else its weights' dtype."""
        return self.engine.kv_dtype or self.engine.weight_dtype


class ModelRunner:
    """Runs the model of one rank over its KV cache.

    Args:
        config: model, cache and backend settings.
        tp: this rank's tensor-parallel context.
        kv_buffer: optional external KV pool memory (see `KVCache`).
    Raises:
        ModelError, KVLayoutError, AttentionBackendError: the model, cache or backend cannot be built.
    """

    def __init__(self, config: RunnerConfig, tp: TensorParallel, kv_buffer: PoolMemory | None = None):
        self.config = config
        self.tp = tp
        engine = config.engine
        self.device = torch.device(engine.device)
        self.model = build_model(config.model, tp, dtype=engine.weight_dtype, device=engine.device, seed=engine.seed,
                                 load_format=engine.load_format)
        if self.device.type == "cpu":  # which matmul form decoding and prefill take on this machine, per weight shape
            from disaggsdk.engine.models.layers import amx_linear, skinny, wide_gemm

            skinny.calibrate(self.model.parameters())
            wide_gemm.calibrate(self.model.parameters())
            amx_linear.pack_model(self.model)  # bfloat16 weights, where the CPU has AMX
        geometry = kv_geometry(self.model.arch, tp, config.extra_kv_layers)
        self.kv_cache = KVCache(
            geometry, engine.num_pages, engine.page_size, engine.layout, config.kv_dtype, engine.device, kv_buffer,
            scales=self._kv_scales(geometry) if kv_dtype_name(config.kv_dtype) == "float8_e4m3fn" else None,
        )
        self.attn = create_backend(
            engine.attention_backend or default_backend(engine.device, engine.weight_dtype, kv_dtype_name(config.kv_dtype)),
            self.kv_cache)
        self.compiled: CompiledStep | None = None
        # expert parallelism's exchange sizes its buffers from the routing on the host: not a graph to compile
        if config.compile and tp.size == 1 and tp.experts is None and self.device.type == "cpu":
            from disaggsdk.engine.compiled_step import CompiledStep

            self.compiled = CompiledStep(self.model, self.attn)
        self.decode_graphs: CudaGraphStep | None = None  # made by `capture_decode_graphs`
        # the pool's last page is the graphs' scratch page (their padding rows' KV): the engine's page
        # allocator leaves it out
        self.num_scratch_pages = 1 if self._can_capture_decode_graphs() else 0

    def _can_capture_decode_graphs(self) -> bool:
        """CUDA graphs of decode steps: asked for (``compile``), a CUDA rank of tp 1 on FlashInfer's
        GQA wrappers, a pool with a page to spare, no speculative decoding (its steps carry drafts,
        and the MTP layer reuses the step's plan), and no host sync in the model (expert
        parallelism's exchange; experts in a dtype other than bfloat16 loop on the host)."""
        config, engine = self.config, self.config.engine
        if not (config.compile and self.device.type == "cuda" and self.tp.size == 1 and self.tp.experts is None
                and engine.num_pages >= 2 and engine.speculative is None
                and (not self.model.arch.num_experts or engine.weight_dtype == "bfloat16")):
            return False
        from disaggsdk.engine.attention.flashinfer_backend import FlashInferBackend

        return isinstance(self.attn, FlashInferBackend) and self.attn.supports_decode_graphs

    def capture_decode_graphs(self, on_layer_done: Callable[[int, torch.Tensor], None] | None) -> bool:
        """Capture decode steps as CUDA graphs (engine.cuda_graph_step), when this rank can
        (``num_scratch_pages`` says) and a graph can hold ``on_layer_done`` (the engine's layer
        counter callback: a `DeviceLayerCounter`'s, or None); from then on `run` replays them for
        pure decode steps. Returns whether it captured."""
        from disaggsdk.engine.cuda_graph_step import CudaGraphStep, is_capturable_counter

        if not self.num_scratch_pages or not is_capturable_counter(on_layer_done):
            return False
        from disaggsdk.engine.attention.flashinfer_backend import FlashInferBackend

        assert isinstance(self.attn, FlashInferBackend)
        engine = self.config.engine
        graphs = CudaGraphStep(self.model, self.attn, min(engine.max_num_seqs, engine.max_num_batched_tokens),
                               scratch_page_id=self.kv_cache.num_pages - 1, on_layer_done=on_layer_done)
        graphs.capture()
        self.decode_graphs = graphs
        return True

    def _kv_scales(self, geometry: KVGeometry) -> KVScales:
        """An fp8 cache's static per-layer scales: the checkpoint's (1.0 where it has none, and for
        random weights), so that prefill and decode units of one model store the same bytes."""
        from disaggsdk.models.shipped import checkpoint_directory

        load_format = self.config.engine.load_format
        directory = checkpoint_directory(self.config.model) if load_format == "auto" else None
        return read_kv_scales(directory, geometry.num_layers, geometry.attention)

    def run(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one step.

        Args:
            batch: the step's batch (tensors on this rank's device).
        Returns:
            (hidden, logits): hidden states [num_logits, hidden_size] and float32 logits
            [num_logits, vocab_size] of the rows in ``batch.logits_indices``.
        """
        return self.run_keeping_hidden(batch)[1:]

    @torch.inference_mode()
    def run_keeping_hidden(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`run`, also giving the hidden states of every row first ([num_tokens, hidden_size]: what
        the MTP layer reads); the attention backend stays planned for ``batch``."""
        if self.decode_graphs is not None and self.decode_graphs.can_run(batch):
            hidden_all = self.decode_graphs(batch)  # plans the backend for the padded batch itself
        else:
            if batch.num_tokens:  # an idle lock-step rank's empty batch has nothing to plan (engine.dp_lockstep)
                self.attn.plan(batch)
            hidden_all = self.model(batch, self.attn) if self.compiled is None else self.compiled(batch)
        rows = hidden_all[batch.logits_indices]
        if rows.shape[0] == 0:
            return hidden_all, rows, torch.empty(0, self.model.arch.vocab_size, device=rows.device)
        return hidden_all, rows, self.model.compute_logits(rows).float()

    def warm_up(self, on_layer_done: Callable[[int, torch.Tensor], None] | None) -> None:
        """Run the step with one token, two, and more than `skinny.MAX_ROWS` (the compiled step's
        three graphs: the skinny matmuls branch on the rows), so that compiling happens now rather
        than in the first requests. The tokens go to page 0 of a pool nothing uses yet;
        ``on_layer_done`` is the engine's layer counter (the graphs are specialised on having one).
        With the MTP layer's KV in the pool (drafting), its compiled forward and draft warm up too."""
        from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch
        from disaggsdk.engine.models.layers.skinny import MAX_ROWS

        compiled_mtp = (self.compiled if self.config.extra_kv_layers > 0 and self.model.draft_layer() is not None
                        else None)
        for n in (1, 2, MAX_ROWS + 1):
            item = BatchItem(token_ids=[0] * n, start_pos=0, page_ids=[0] * -(-n // self.config.engine.page_size))
            batch = build_forward_batch([item], self.config.engine.page_size, self.device, on_layer_done)
            hidden_all = self.run_keeping_hidden(batch)[0]
            if compiled_mtp is not None:
                last_row = torch.tensor([n - 1], dtype=torch.int64, device=self.device)
                compiled_mtp.mtp_draft(hidden_all, batch.input_ids, batch.positions, last_row, on_layer_done)
