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
from disaggsdk.engine.modeling import build_model, kv_geometry
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.kv.layout import kv_dtype_name

if TYPE_CHECKING:
    from disaggsdk.engine.background_compile import StepCompilation
    from disaggsdk.engine.compile_progress import CompileProgress
    from disaggsdk.engine.compiled_step.base import AnyCompiledStep
    from disaggsdk.engine.modeling.base import KVGeometry
    from disaggsdk.kv.layout import PoolMemory


@dataclass(frozen=True)
class RunnerConfig:
    """What a rank needs to build its part of the engine (picklable, sent to TP workers): the
    engine's settings (the KV pool's size and format, the model's dtype, device, seed and weights,
    the attention backend, where tp workers hand their pool over), and what the engine decided
    from them."""

    model: str
    engine: EngineConfig
    # compile the step: `$.engine.compile`, its unset resolved by the head (the environment's default);
    # only a rank of tp 1 does: torch.compile on a CPU (engine.compiled_step.torch_compile), CUDA graphs of its
    # decode steps on a GPU (engine.compiled_step.cuda_graphs)
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
            from disaggsdk.engine.host_allocator import keep_freed_memory
            from disaggsdk.engine.modeling.layers import amx_linear, skinny, wide_gemm

            keep_freed_memory()  # the steps' buffers reused, not faulted in again each step
            skinny.calibrate(self.model.parameters())
            wide_gemm.calibrate(self.model.parameters())
            amx_linear.pack_model(self.model)  # bfloat16 weights, where the CPU has AMX
        geometry = kv_geometry(self.model.arch, tp, config.extra_kv_layers)
        scales = self._kv_scales(geometry) if kv_dtype_name(config.kv_dtype) == "float8_e4m3fn" else None
        self.kv_cache = KVCache(
            geometry, engine.num_pages, engine.page_size, engine.layout, config.kv_dtype, engine.device, kv_buffer,
            scales=scales,
        )
        self._backend_name = (engine.attention_backend
                              or default_backend(engine.device, engine.weight_dtype, kv_dtype_name(config.kv_dtype)))
        self.attn = create_backend(self._backend_name, self.kv_cache)
        # the compiled step `run` uses where it `can_run` a batch, once ready: on a CPU the compiled
        # step (`start_compile`, adopted by `take_compile_outcome`), on a GPU the decode graphs
        # (`capture_decode_graphs`); None: eager
        self.step: AnyCompiledStep | None = None
        self.compilation: StepCompilation | None = None
        self._scratch_kv = (geometry, scales)  # the warm-up's one-page cache is of this format
        # the pool's last page is the graphs' scratch page (their padding rows' KV): the engine's page
        # allocator leaves it out
        self.num_scratch_pages = 1 if self._can_capture_decode_graphs() else 0

    @property
    def can_compile(self) -> bool:
        """Whether this rank compiles its step (torch.compile on a CPU): asked (``compile``), tp 1, and
        no expert parallelism (its exchange sizes its buffers from the routing on the host: not a
        graph to compile)."""
        return (self.config.compile and self.tp.size == 1 and self.tp.experts is None
                and self.device.type == "cpu")

    def start_compile(self, on_layer_done: Callable[[int, torch.Tensor], None] | None, in_background: bool) -> None:
        """Compile the step (`can_compile` must hold), on a thread of its own while the rank runs
        eagerly (``in_background``, where this torch allows it: `background_compile.background_supported`)
        or now; `take_compile_outcome` adopts it. ``on_layer_done`` is
        the engine's layer counter callback (the graphs are specialised on having one)."""
        from disaggsdk.engine.background_compile import StepCompilation, background_supported, warm_up_graphs
        from disaggsdk.engine.compiled_step import new_compiled_step
        from disaggsdk.engine.compiled_step.torch_compile import CompiledStep

        assert self.can_compile and self.compilation is None
        engine = self.config.engine
        step = new_compiled_step(self.device, self.model, self.attn, engine, on_layer_done)
        assert isinstance(step, CompiledStep)  # can_compile: a CPU rank
        geometry, scales = self._scratch_kv
        scratch = create_backend(self._backend_name, KVCache(geometry, 1, engine.page_size, engine.layout,
                                                             self.config.kv_dtype, engine.device, None, scales=scales))
        with_mtp = self.config.extra_kv_layers > 0 and self.model.draft_layer() is not None
        self.compilation = StepCompilation(
            step, lambda stop: warm_up_graphs(step, scratch, engine.page_size, self.device, on_layer_done, with_mtp, stop),
            in_background and background_supported())
        self.compilation.start()

    def take_compile_outcome(self) -> CompileProgress | None:
        """Call between steps: once the compile ended, its outcome, once; when it compiled, `step`
        is the compiled step from now on. None while it runs, and ever after it was taken."""
        outcome = self.compilation.outcome() if self.compilation is not None else None
        if outcome is not None and outcome.stage == "compiled":
            assert self.compilation is not None
            self.step = self.compilation.step
        return outcome

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
        """Capture decode steps as CUDA graphs (engine.compiled_step.cuda_graphs), when this rank can
        (``num_scratch_pages`` says) and a graph can hold ``on_layer_done`` (the engine's layer
        counter callback: a `DeviceLayerCounter`'s, or None); from then on they are `step`, and `run`
        replays them for pure decode steps. Returns whether it captured."""
        from disaggsdk.engine.compiled_step import new_compiled_step
        from disaggsdk.engine.compiled_step.cuda_graphs import CudaGraphStep, is_capturable_counter

        if not self.num_scratch_pages or not is_capturable_counter(on_layer_done):
            return False
        graphs = new_compiled_step(self.device, self.model, self.attn, self.config.engine, on_layer_done)
        assert isinstance(graphs, CudaGraphStep)  # num_scratch_pages: a CUDA rank on FlashInfer
        graphs.capture()
        self.step = graphs
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
        if self.step is not None and self.step.can_run(batch):
            hidden_all = self.step(batch)  # plans the backend itself
        else:
            if batch.num_tokens:  # an idle lock-step rank's empty batch has nothing to plan (engine.dp_lockstep)
                self.attn.plan(batch)
            hidden_all = self.model(batch, self.attn)
        rows = hidden_all[batch.logits_indices]
        if rows.shape[0] == 0:
            return hidden_all, rows, torch.empty(0, self.model.arch.vocab_size, device=rows.device)
        return hidden_all, rows, self.model.compute_logits(rows).float()
