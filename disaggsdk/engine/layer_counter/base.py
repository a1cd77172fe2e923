"""The layer counter contract: what the engine drives and the messenger's streamer reads, met by
the CPU twin (`host.LayerCounter`) and the CUDA twin (`device.DeviceLayerCounter`)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class AnyLayerCounter(Protocol):
    """A step's layer counter, as the engine drives it and the messenger's streamer reads it: the
    CPU twin `host.LayerCounter` (a shared tensor under a condition variable) or, on a CUDA device,
    `device.DeviceLayerCounter` (host-mapped memory a stream-ordered op writes, so a CUDA graph's
    replay bumps it with no Python running).

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
