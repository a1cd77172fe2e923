"""Hooks the messenger uses to follow a step: a layer counter and the per-step chunk plan."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class StepChunkInfo:
    """Which tokens of which request a step computes, and the pages they fill.

    Tokens ``[start_pos, start_pos + num_tokens)`` land in ``page_ids`` (the request's pages in
    order; token t sits in ``page_ids[t // page_size]`` at offset ``t % page_size``).
    """

    request_id: str
    start_pos: int
    num_tokens: int
    page_ids: tuple[int, ...]
    is_last_prefill_chunk: bool  # after this step the request's prefill is complete


@runtime_checkable
class AnyLayerCounter(Protocol):
    """A step's layer counter, as the engine drives it and the messenger's streamer reads it: the
    CPU twin `LayerCounter` (a shared tensor under a condition variable) or, on a CUDA device,
    `engine.device_layer_counter.DeviceLayerCounter` (host-mapped memory a stream-ordered op writes,
    so a CUDA graph's replay bumps it with no Python running).

    The engine calls ``begin_step`` before it launches a step, the model ``on_layer_done`` after each
    layer's attention output projection; another thread ``read``s or ``wait``s.
    """

    values: torch.Tensor  # [2], int64, [step_id, layers_done]: the memory the model's op writes

    def begin_step(self) -> int:
        """Start counting a new step; returns its id (1, 2, ...)."""
        ...

    def on_layer_done(self, layer_id: int, output: torch.Tensor | None = None) -> None:
        """Layer ``layer_id`` of the current step is complete (``output``: its attention output)."""
        ...

    def read(self) -> tuple[int, int]:
        """(step_id, layers_done): the latest begun step and how many of its layers are complete."""
        ...

    def wait(self, step_id: int, layers_done: int, timeout_s: float | None = None) -> bool:
        """Block until step ``step_id`` has ``layers_done`` layers (or a later step began);
        False on timeout."""
        ...


def new_layer_counter(device: torch.device) -> AnyLayerCounter:
    """The layer counter for an engine on ``device``: `DeviceLayerCounter` on CUDA (its memory
    pinned on the host and mapped into the device), `LayerCounter` anywhere else.

    Raises:
        RuntimeError: a CUDA ``device`` without a usable CUDA runtime.
    """
    if device.type == "cuda":
        from disaggsdk.engine.device_layer_counter import DeviceLayerCounter

        return DeviceLayerCounter.on_device(device)
    return LayerCounter()


class LayerCounter:
    """Layers completed by the running step, readable from another thread (the CPU twin of
    `engine.device_layer_counter.DeviceLayerCounter`; both are `AnyLayerCounter`s).

    The model bumps it after each layer's attention output projection: the eager model through
    ``ForwardBatch.on_layer_done``, a compiled step through the ``disaggsdk::layer_done`` op
    (`engine.graph_ops`), which writes ``values``. A polling thread reads ``(step_id,
    layers_done)`` or blocks in ``wait``. Ints under a condition variable, mirrored in ``values``.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._step_id = 0
        self._layers_done = 0
        self.values = torch.zeros(2, dtype=torch.int64)  # [step_id, layers_done]: the graph op's output
        self._values = self.values.numpy()  # the same memory: a store here costs ns, not a dispatch

    def begin_step(self) -> int:
        """Start counting a new step; returns its id (1, 2, ...)."""
        with self._cond:
            self._step_id += 1
            self._layers_done = 0
            self._values[0], self._values[1] = self._step_id, 0
            self._cond.notify_all()
            return self._step_id

    def on_layer_done(self, layer_id: int, output: torch.Tensor | None = None) -> None:
        """The model's callback: layer ``layer_id`` of the current step is complete (``output``,
        the layer's attention output, only orders a compiled graph's op)."""
        with self._cond:
            self._layers_done = layer_id + 1
            self._values[1] = self._layers_done
            self._cond.notify_all()

    def read(self) -> tuple[int, int]:
        """(step_id, layers_done) as of now."""
        with self._cond:
            return self._step_id, self._layers_done

    def wait(self, step_id: int, layers_done: int, timeout_s: float | None = None) -> bool:
        """Block until step ``step_id`` has ``layers_done`` layers (or a later step began).

        Returns:
            True when reached, False on timeout.
        """
        with self._cond:
            return self._cond.wait_for(
                lambda: self._step_id > step_id or (self._step_id == step_id and self._layers_done >= layers_done),
                timeout=timeout_s,
            )
