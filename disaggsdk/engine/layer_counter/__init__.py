"""Layer counters: a registry of the twins by device type, and a factory that imports the chosen
one lazily.
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
