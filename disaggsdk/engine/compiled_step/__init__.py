"""Compiled steps: the model's step in a faster form than the eager forward, one twin per device.

``cpu`` (`torch_compile.CompiledStep`) is the step under `torch.compile`, attention and the layer
counter as graph ops; ``cuda`` (`cuda_graphs.CudaGraphStep`) is decode steps captured as CUDA graphs.
"""

from __future__ import annotations

import os

COMPILE_ENV = "DISAGGSDK_COMPILE"  # "0": run eagerly where a config leaves compile unset


def compile_by_default() -> bool:
    """Whether engines compile their step when their config does not say (``DISAGGSDK_COMPILE``)."""
    return os.environ.get(COMPILE_ENV, "1") != "0"
