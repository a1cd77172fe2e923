"""The layer counter of a CPU engine: ints under a condition variable, mirrored in a tensor a graph
op writes (the CPU twin of `device.DeviceLayerCounter`)."""

from __future__ import annotations

import threading

import torch


class LayerCounter:
    """Layers completed by the running step, readable from another thread (the CPU twin of
    `device.DeviceLayerCounter`; both are `base.AnyLayerCounter`s).

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

    @classmethod
    def on_device(cls, device: torch.device | str) -> LayerCounter:
        """A counter for an engine on ``device`` (the registry's uniform constructor; host memory
        serves any device that is not CUDA)."""
        return cls()

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
