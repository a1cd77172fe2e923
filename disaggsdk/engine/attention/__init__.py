"""Attention backends: a registry of names and a factory that imports the chosen one lazily.

``torch_ref`` runs anywhere and is the test oracle; ``cpu`` is it with decode by a native kernel
(the optional extension built by setup.py); ``flashinfer`` needs a CUDA GPU and the
``flashinfer-python`` package. A 16-bit engine on a CUDA device without that package is an error
(`FlashInferMissing`), not a silent fall back to the reference (a test oracle, not a GPU kernel);
it runs the reference only when its config names ``torch_ref``.
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


# what every FlashInferMissing says to install (`default_backend`, the backend's own import); the `gpu`
# extra brings flashinfer-python beside cuda-python
FLASHINFER_INSTALL = "pip install flashinfer-python (or the gpu extra: pip install 'disaggsdk[gpu]')"


class FlashInferMissing(AttentionBackendError):
    """A CUDA engine's attention is FlashInfer, and the ``flashinfer`` package cannot be imported."""


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


def default_backend(device: str, weight_dtype: str = "bfloat16", kv_dtype: str = "bfloat16") -> str:
    """The backend name to use on ``device``: "cuda..." -> flashinfer when the step is 16-bit
    (FlashInfer's kernels take fp16/bf16 queries and fp16/bf16/fp8 KV: a float32 model or cache on a
    GPU runs the torch reference), "cpu" -> the native decode kernel when built; otherwise the torch
    reference.

    Args:
        device: the engine's torch device ("cpu", "cuda", "cuda:N").
        weight_dtype: the dtype the weights are held in (the queries' dtype), a torch dtype name.
        kv_dtype: the KV cache's element type, a torch dtype name ("float8_e4m3fn" for fp8).
    Raises:
        FlashInferMissing: a 16-bit step on a CUDA device and no ``flashinfer`` package. The torch
            reference there is a choice to make explicitly (``EngineConfig(attention_backend=
            "torch_ref")``), never a silent fall back.
    """
    sixteen_bit = weight_dtype in ("bfloat16", "float16") and kv_dtype != "float32"
    if device.startswith("cuda") and sixteen_bit:
        if importlib.util.find_spec("flashinfer") is None:
            raise FlashInferMissing(
                f"a {weight_dtype} engine on {device} runs attention in FlashInfer, and the flashinfer package is "
                f"not installed: {FLASHINFER_INSTALL}; or ask for the torch reference (the test oracle) with "
                f"attention_backend='torch_ref'"
            )
        return "flashinfer"
    if device == "cpu" and importlib.util.find_spec(CPU_KERNELS_MODULE) is not None:
        return "cpu"
    return "torch_ref"
