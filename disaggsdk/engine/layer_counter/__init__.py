"""Layer counters: a registry of the twins by device type, and a factory that imports the chosen
one lazily.

After each layer's attention output projection the model bumps the step's layer counter, and the
prefill messenger's streamer thread waits on it to write that layer's pages (DESIGN.md, "The KV
messenger"). ``cpu`` (`host.LayerCounter`) is ints under a condition variable, mirrored in a
tensor a graph op writes; ``cuda`` (`device.DeviceLayerCounter`) is pinned host memory mapped into
the device, which a stream-ordered fill writes, so a CUDA graph's replay bumps it. Both meet
`base.AnyLayerCounter`; a `gpu` test compares them (tests/engine/test_device_layer_counter.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.layer_counter.base import AnyLayerCounter

# torch device type -> "module:class"; each class builds one with `on_device(device)`. Any other
# device type counts on the host.
COUNTERS = {
    "cpu": "disaggsdk.engine.layer_counter.host:LayerCounter",
    "cuda": "disaggsdk.engine.layer_counter.device:DeviceLayerCounter",
}


def new_layer_counter(device: torch.device) -> AnyLayerCounter:
    """The layer counter for an engine on ``device``: `device.DeviceLayerCounter` on CUDA (its memory
    pinned on the host and mapped into the device), `host.LayerCounter` anywhere else.

    Raises:
        RuntimeError: a CUDA ``device`` without a usable CUDA runtime.
    """
    module_name, cls_name = COUNTERS.get(device.type, COUNTERS["cpu"]).split(":")
    counter: AnyLayerCounter = getattr(importlib.import_module(module_name), cls_name).on_device(device)
    return counter
