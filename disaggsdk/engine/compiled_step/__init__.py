"""Compiled steps: the model's step in a faster form than the eager forward, a registry of the
twins by device type, and a factory that imports the chosen one lazily.

``cpu`` (`torch_compile.CompiledStep`) is the step under `torch.compile`, attention and the layer
counter as graph ops, compiled while the engine serves (engine.background_compile); ``cuda``
(`cuda_graphs.CudaGraphStep`) is decode steps captured as CUDA graphs before it serves. Both meet
`base.AnyCompiledStep`, which `ModelRunner.run` drives.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from disaggsdk.engine.attention.base import AttentionBackend
    from disaggsdk.engine.compiled_step.base import AnyCompiledStep
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.engine.modeling.layers.decoder import DecoderModel

COMPILE_ENV = "DISAGGSDK_COMPILE"  # "0": run eagerly where a config leaves compile unset


def compile_by_default() -> bool:
    """Whether engines compile their step when their config does not say (``DISAGGSDK_COMPILE``)."""
    return os.environ.get(COMPILE_ENV, "1") != "0"


# torch device type -> "module:class"; each class builds one for a rank with `for_rank(model,
# backend, engine, on_layer_done)`
STEPS = {
    "cpu": "disaggsdk.engine.compiled_step.torch_compile:CompiledStep",
    "cuda": "disaggsdk.engine.compiled_step.cuda_graphs:CudaGraphStep",
}


def new_compiled_step(device: torch.device, model: DecoderModel, backend: AttentionBackend, engine: EngineConfig,
                      on_layer_done: Callable[[int, torch.Tensor], None] | None) -> AnyCompiledStep:
    """The compiled step for a rank on ``device`` (made, not yet compiled or captured).

    Args:
        device: the rank's device; its type picks the twin (a key of ``STEPS``).
        model: the rank's model (tp 1).
        backend: its attention backend (on CUDA, FlashInfer's).
        engine: the engine's settings (the CUDA twin sizes its graphs by them).
        on_layer_done: the engine's layer counter callback, or None.
    Raises:
        KeyError: a device type with no compiled step.
    """
    module_name, cls_name = STEPS[device.type].split(":")
    step: AnyCompiledStep = getattr(importlib.import_module(module_name), cls_name).for_rank(
        model, backend, engine, on_layer_done)
    return step
