"""The layer counter of a CUDA engine: ``[step_id, layers_done]`` in host memory the GPU writes."""

from __future__ import annotations

import threading
import time

import torch

# how long a waiting reader sleeps between looks at the host memory: a decode layer takes tens of
# microseconds, a prefill layer more; a shorter sleep only burns the reader's core
POLL_INTERVAL_S = 20e-6


def mapped_view(host: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor over the memory of the pinned host tensor ``host`` (under unified addressing its
    host pointer is the device pointer): kernels that write the view write ``host``.

    Args:
        host: pinned, contiguous, int64, on the CPU.
    Returns:
        A CUDA tensor of ``host``'s shape at ``host``'s address, on the device the memory was
        pinned for.
    Raises:
        ValueError: ``host`` is not a pinned contiguous int64 CPU tensor.
        RuntimeError: torch copied instead of aliasing (no unified addressing).
    """
    if host.device.type != "cpu" or host.dtype != torch.int64 or not host.is_contiguous() or not host.is_pinned():
        raise ValueError("mapped_view needs a pinned, contiguous int64 CPU tensor (torch.zeros(..., pin_memory=True))")
    from disaggsdk.kv.pools.cuda_array import cuda_bytes

    view = cuda_bytes(host.data_ptr(), host.numel() * host.element_size(), owner=host).view(torch.int64).view(host.shape)
    if view.device.type != "cuda" or view.data_ptr() != host.data_ptr():
        raise RuntimeError(f"pinned memory at {host.data_ptr():#x} is not addressable from the GPU as it is "
                           f"(torch made {view.device} memory at {view.data_ptr():#x}); this CUDA platform "
                           f"lacks unified virtual addressing")
    return view


class DeviceLayerCounter:
    """Layers completed by the running step, written by the device, read by a polling thread.

    Args:
        host_values: the counter's memory as the host reads it: [2], int64, contiguous.
        values: the same memory as the model's op writes it ([2], int64): on a GPU
            ``mapped_view(host_values)`` (see `on_device`); on a CPU ``host_values`` itself.
    """

    def __init__(self, host_values: torch.Tensor, values: torch.Tensor):
        if host_values.data_ptr() != values.data_ptr() or values.shape != (2,) or values.dtype != torch.int64:
            raise ValueError("values must be a [2] int64 view of host_values' memory")
        self._lock = threading.Lock()  # begin_step from the engine's thread, read from others
        self._step_id = 0  # the latest step the host began
        self.host_values = host_values  # keeps the memory alive
        self._host = host_values.numpy()  # a load here reads the memory, no torch dispatch
        self.values = values  # [2], int64, [step_id, layers_done]: what the model's op writes
        # the elements as views made once: a fill per layer should not pay for indexing
        self._step_cell, self._layers_cell = values[0], values[1]
        self._host[0], self._host[1] = 0, 0

    @classmethod
    def on_device(cls, device: torch.device | str) -> DeviceLayerCounter:
        """A counter whose memory is pinned host memory mapped into CUDA ``device``.

        Raises:
            RuntimeError: no CUDA runtime, or the memory cannot be mapped into ``device``.
        """
        device = torch.device(device)
        if device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"a device layer counter needs a CUDA device, not {device} (torch.cuda.is_available() "
                               f"is {torch.cuda.is_available()}); a CPU engine uses engine.layer_counter.host.LayerCounter")
        with torch.cuda.device(device):
            host = torch.zeros(2, dtype=torch.int64, pin_memory=True)
            view = mapped_view(host)
        index = device.index if device.index is not None else torch.cuda.current_device()
        if view.device.index != index:
            raise RuntimeError(f"the counter's pinned memory belongs to {view.device}, not {device}: "
                               f"run one engine per visible GPU (CUDA_VISIBLE_DEVICES)")
        return cls(host, view)

    def begin_step(self) -> int:
        """Start counting a new step; returns its id (1, 2, ...). Call it before the step is launched:
        its writes are queued on the current stream behind the previous step's."""
        with self._lock:
            self._step_id += 1
            self._layers_cell.fill_(0)  # first: the new id must never meet the old step's count
            self._step_cell.fill_(self._step_id)
            return self._step_id

    def on_layer_done(self, layer_id: int, output: torch.Tensor | None = None) -> None:
        """Layer ``layer_id`` of the current step is complete: a fill queued behind ``output``'s
        kernels (the stream orders them; ``output`` is only the interface's), which a CUDA graph
        captured around the model records with ``layer_id`` baked in."""
        self._layers_cell.fill_(layer_id + 1)

    def _device_pair(self) -> tuple[int, int]:
        """(step_id, layers_done) as the device last wrote them: the id read before and after the
        count, so that both belong to one step."""
        while True:
            step_id = int(self._host[0])
            layers_done = int(self._host[1])
            if int(self._host[0]) == step_id:
                return step_id, layers_done

    def read(self) -> tuple[int, int]:
        """(step_id, layers_done): the latest step the host began, and its layers complete on the
        device so far (0 while the device still runs an earlier step)."""
        with self._lock:
            begun = self._step_id
        step_id, layers_done = self._device_pair()
        return begun, layers_done if step_id == begun else 0

    def wait(self, step_id: int, layers_done: int, timeout_s: float | None = None) -> bool:
        """Poll until the device finished ``layers_done`` layers of step ``step_id`` (or began a
        later step: stream order says every layer of ``step_id`` is done then).

        Returns:
            True when reached, False on timeout.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            device_step, device_layers = self._device_pair()
            if device_step > step_id or (device_step == step_id and device_layers >= layers_done):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_INTERVAL_S)
