"""Attention backends: a registry of names and a factory that imports the chosen one lazily.

``torch_ref`` runs anywhere and is the test oracle; ``cpu`` is it with decode by a native kernel
(the optional extension built by setup.py); ``flashinfer`` needs a CUDA GPU and the
``flashinfer-python`` package.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.engine.attention.base import AttentionBackend
    from disaggsdk.engine.kv_cache import KVCache

# name -> "module:class"
BACKENDS = {
    "torch_ref": "disaggsdk.engine.attention.torch_ref:TorchRefBackend",
    "cpu": "disaggsdk.engine.attention.cpu_backend:CpuBackend",
    "flashinfer": "disaggsdk.engine.attention.flashinfer_backend:FlashInferBackend",
}


CPU_KERNELS_MODULE = "disaggsdk.engine.attention._cpu_kernels"


class AttentionBackendError(DisaggError):
    """An attention backend is unknown or cannot run here."""


def create_backend(name: str, kv_cache: KVCache) -> AttentionBackend:
    """Build the attention backend ``name`` over ``kv_cache``.

    Args:
        name: a key of ``BACKENDS``.
        kv_cache: the rank's KV cache the backend reads and writes.
    Returns:
        The backend.
    Raises:
        AttentionBackendError: unknown name, or the backend's dependencies are missing.
    """
    if name not in BACKENDS:
        raise AttentionBackendError(f"unknown attention backend {name!r}; use one of {sorted(BACKENDS)}")
    module_name, cls_name = BACKENDS[name].split(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)(kv_cache)


def default_backend(device: str) -> str:
    """The backend name to use on ``device``: "cuda..." -> flashinfer when importable, "cpu" -> the
    native decode kernel when built; otherwise the torch reference."""
    if device.startswith("cuda") and importlib.util.find_spec("flashinfer") is not None:
        return "flashinfer"
    if device == "cpu" and importlib.util.find_spec(CPU_KERNELS_MODULE) is not None:
        return "cpu"
    return "torch_ref"
