"""Decode steps as CUDA graphs at padded batch sizes (the CUDA twin of `engine.compiled_step.torch_compile`).

The forward is captured once per size of `capture_batch_sizes` over static buffers; a step of ``n``
requests replays the smallest captured size ``>= n``, padding rows pointed at a scratch page. The layer
counter (`engine.layer_counter.device.DeviceLayerCounter`) is captured inside; logits run eagerly after.
Written, not yet run on a GPU: the `gpu`-marked tests compare it with the eager CUDA step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MethodType
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import AttentionBackend
    from disaggsdk.engine.attention.flashinfer_backend import FlashInferBackend
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.forward_batch import ForwardBatch
    from disaggsdk.engine.modeling.layers.decoder import DecoderModel

# the largest decode batch captured, whatever max_num_seqs says: each size is one graph (seconds
# of capture, a workspace's memory), and beyond a few hundred requests a step is compute-bound, so
# replaying saves little over launching
MAX_GRAPH_BATCH_SIZE = 512


def capture_batch_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes to capture: powers of two below ``max_batch_size``, then ``max_batch_size``
    itself (capped at `MAX_GRAPH_BATCH_SIZE`), so that every decode batch up to the cap has a graph
    at most twice its size.

    Args:
        max_batch_size: the most requests a decode step can hold (the engine's ``max_num_seqs``).
    Returns:
        Increasing sizes, starting at 1.
    Raises:
        ValueError: ``max_batch_size`` < 1.
    """
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    cap = min(max_batch_size, MAX_GRAPH_BATCH_SIZE)
    sizes = []
    size = 1
    while size < cap:
        sizes.append(size)
        size *= 2
    sizes.append(cap)
    return tuple(sizes)


def padded_batch_size(batch_size: int, sizes: Sequence[int]) -> int | None:
    """The captured size a batch of ``batch_size`` requests replays: the smallest of ``sizes`` that
    holds it; None when none does (the step runs eagerly)."""
    fitting = [s for s in sizes if s >= batch_size]
    return min(fitting) if fitting and batch_size >= 1 else None


@dataclass(frozen=True)
class PaddedDecode:
    """A decode step's page table padded to a captured batch size (host tensors: FlashInfer's
    ``plan`` reads them on the host). Rows ``[num_requests, batch_size)`` are padding: one token at
    position 0 of the scratch page, KV length 1."""

    batch_size: int  # the captured size replayed
    num_requests: int  # the real rows, first
    kv_page_indptr: torch.Tensor  # [batch_size + 1], int32, cpu
    kv_page_indices: torch.Tensor  # [kv_page_indptr[-1]], int32, cpu
    kv_last_page_len: torch.Tensor  # [batch_size], int32, cpu
    kv_slot_ids: torch.Tensor  # [batch_size], int64, cpu: page_id * page_size + offset of each new token


def pad_decode_batch(kv_page_indptr: torch.Tensor, kv_page_indices: torch.Tensor, kv_last_page_len: torch.Tensor,
                     kv_slot_ids: torch.Tensor, batch_size: int, scratch_page_id: int, page_size: int) -> PaddedDecode:
    """A decode step's page table (a `ForwardBatch`'s fields, any device) with padding rows appended
    up to ``batch_size`` requests.

    Args:
        kv_page_indptr: [n + 1], the real requests' page offsets.
        kv_page_indices: [kv_page_indptr[-1]], their pages.
        kv_last_page_len: [n], tokens in each one's last page.
        kv_slot_ids: [n], where each one's new token goes.
        batch_size: the padded size (>= n).
        scratch_page_id: the page the padding rows write and read (no request's).
        page_size: tokens per page.
    Returns:
        The padded table, on the CPU.
    Raises:
        ValueError: ``batch_size`` smaller than the batch.
    """
    num_requests = int(kv_last_page_len.numel())
    num_padding = batch_size - num_requests
    if num_padding < 0:
        raise ValueError(f"cannot pad a batch of {num_requests} requests to {batch_size}")
    indptr = kv_page_indptr.to("cpu", torch.int32)
    padding = torch.arange(1, num_padding + 1, dtype=torch.int32) + indptr[-1]  # one page each
    return PaddedDecode(
        batch_size=batch_size,
        num_requests=num_requests,
        kv_page_indptr=torch.cat([indptr, padding]),
        kv_page_indices=torch.cat([kv_page_indices.to("cpu", torch.int32),
                                   torch.full((num_padding,), scratch_page_id, dtype=torch.int32)]),
        kv_last_page_len=torch.cat([kv_last_page_len.to("cpu", torch.int32),
                                    torch.ones(num_padding, dtype=torch.int32)]),
        kv_slot_ids=torch.cat([kv_slot_ids.to("cpu", torch.int64),
                               torch.full((num_padding,), scratch_page_id * page_size, dtype=torch.int64)]),
    )


def is_capturable_counter(on_layer_done: Callable[[int, torch.Tensor], None] | None) -> bool:
    """Whether a graph can hold ``on_layer_done``: None, or a `DeviceLayerCounter`'s (a kernel per
    layer). Any other callback runs Python, which a replay would skip."""
    from disaggsdk.engine.layer_counter.device import DeviceLayerCounter

    if on_layer_done is None:
        return True
    owner = on_layer_done.__self__ if isinstance(on_layer_done, MethodType) else None
    return isinstance(owner, DeviceLayerCounter)


class CudaGraphStep:
    """The model's decode forward captured as one CUDA graph per padded batch size.

    Args:
        model: a single rank's model on a CUDA device.
        backend: its FlashInfer backend (graph-mode wrappers are made here).
        max_batch_size: the most requests a decode step holds (see `capture_batch_sizes`).
        scratch_page_id: a page of the pool no request is ever given (the padding rows' KV).
        on_layer_done: the engine's counter callback the graphs hold: None or a
            `DeviceLayerCounter`'s ``on_layer_done``.
    Raises:
        ValueError: a callback a graph cannot hold.
    """

    def __init__(self, model: DecoderModel, backend: FlashInferBackend, max_batch_size: int, scratch_page_id: int,
                 on_layer_done: Callable[[int, torch.Tensor], None] | None):
        if not is_capturable_counter(on_layer_done):
            raise ValueError("a CUDA graph can only hold a DeviceLayerCounter's on_layer_done (or none)")
        self.model = model
        self.attn = backend
        self.page_size = backend.kv_cache.page_size
        self.scratch_page_id = scratch_page_id
        self.on_layer_done = on_layer_done
        self.batch_sizes = capture_batch_sizes(max_batch_size)
        self.device = backend.kv_cache.buffer.device
        largest = self.batch_sizes[-1]
        # page ids a padded step may hold: every page once, plus the padding rows' scratch page.
        # Requests sharing prefix pages list them more than once; a step past this runs eagerly.
        self.max_num_page_ids = backend.kv_cache.num_pages + largest
        self._input_ids = torch.zeros(largest, dtype=torch.int64, device=self.device)  # [largest], int64
        self._positions = torch.zeros(largest, dtype=torch.int64, device=self.device)  # [largest], int64
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # size -> (graph, hidden out)
        self.num_replays = 0  # decode steps that ran as a graph (tests and stats read it)

    @classmethod
    def for_rank(cls, model: DecoderModel, backend: AttentionBackend, engine: EngineConfig,
                 on_layer_done: Callable[[int, torch.Tensor], None] | None) -> CudaGraphStep:
        """The registry's constructor (`disaggsdk.engine.compiled_step.new_compiled_step`): graphs up
        to the engine's largest decode batch, the pool's last page as the scratch page (the engine's
        page allocator leaves it out: `ModelRunner.num_scratch_pages`).

        Raises:
            ValueError: a callback a graph cannot hold.
        """
        from disaggsdk.engine.attention.flashinfer_backend import FlashInferBackend

        assert isinstance(backend, FlashInferBackend), "CUDA graphs replay FlashInfer's graph-mode wrappers"
        return cls(model, backend, min(engine.max_num_seqs, engine.max_num_batched_tokens),
                   scratch_page_id=backend.kv_cache.num_pages - 1, on_layer_done=on_layer_done)

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first (the smaller graphs reuse its memory pool).

        Before the captures, one eager decode step of dummy requests in the scratch page teaches
        the backend the step's head count, softmax scale and dtype (FlashInfer plans with them);
        before each capture, one run of the graph's own path on a side stream warms its kernels.
        """
        from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch

        def dummy_batch(size: int) -> ForwardBatch:
            item = BatchItem(token_ids=[0], start_pos=0, page_ids=[self.scratch_page_id])
            return build_forward_batch([item] * size, self.page_size, self.device)

        eager = dummy_batch(self.batch_sizes[-1])
        self.attn.plan(eager)
        self.model(eager, self.attn)
        self.attn.prepare_decode_graphs(self.batch_sizes, self.max_num_page_ids)
        pool = None
        for size in reversed(self.batch_sizes):
            self._plan(dummy_batch(size), size)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._forward(size)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # thread_local: CUDA calls other threads of the unit make meanwhile (a transfer engine's)
            # are theirs, not an error of this capture
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                hidden = self._forward(size)
            pool = graph.pool()
            self._graphs[size] = (graph, hidden)
        torch.cuda.synchronize(self.device)

    def _forward(self, size: int) -> torch.Tensor:
        return self.model.forward_tokens(self._input_ids[:size], self._positions[:size], self.attn, self.on_layer_done)

    def _plan(self, batch: ForwardBatch, size: int) -> None:
        """Copy ``batch``'s inputs into the static buffers (zeros after them) and plan the graph-mode
        wrapper of ``size`` with its page table padded to ``size``."""
        n = batch.batch_size
        self._input_ids[:n].copy_(batch.input_ids[:n])
        self._input_ids[n:size].zero_()
        self._positions[:n].copy_(batch.positions[:n])
        self._positions[n:size].zero_()
        padded = pad_decode_batch(batch.kv_page_indptr, batch.kv_page_indices, batch.kv_last_page_len,
                                  batch.kv_slot_ids, size, self.scratch_page_id, self.page_size)
        self.attn.plan_decode_graph(padded)

    def can_run(self, batch: ForwardBatch) -> bool:
        """Whether ``batch`` replays a graph: every request brings one token, a captured size holds
        them, the page table fits the static buffer, and its counter callback is the captured one."""
        n = batch.batch_size
        size = padded_batch_size(n, self.batch_sizes)
        return (
            size is not None and batch.num_tokens == n and size in self._graphs
            and batch.on_layer_done == self.on_layer_done
            and int(batch.kv_page_indices.numel()) + size - n <= self.max_num_page_ids
        )

    @torch.inference_mode()  # the static buffers it refills were made under capture's inference mode
    def __call__(self, batch: ForwardBatch) -> torch.Tensor:
        """Hidden states after the final norm for a ``batch`` `can_run` accepted, [num_tokens,
        hidden_size] (a copy: the graph's output buffer is overwritten by the next replay)."""
        n = batch.batch_size
        size = padded_batch_size(n, self.batch_sizes)
        assert size is not None and size in self._graphs, "call can_run first"
        self._plan(batch, size)
        graph, hidden = self._graphs[size]
        graph.replay()
        self.num_replays += 1
        return hidden[:n].clone()
