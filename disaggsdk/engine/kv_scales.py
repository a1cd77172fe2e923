"""The per-layer scales of an fp8 KV cache, and the conversions between computed K/V and stored pages.

An fp8 KV cache (`$.kv.dtype: fp8`, vLLM's ``kv_cache_dtype=fp8``) stores OCP e4m3 (float8_e4m3fn):
``stored = (x / scale)`` rounded to e4m3, saturated to +-448; ``read = stored * scale`` in float32.
GQA layers have a ``k_scale`` and a ``v_scale``; an MLA layer caches one latent (its values are the
first columns of its keys), so it has one scale, ``k_scale``, read for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disaggsdk.errors import ModelError

if TYPE_CHECKING:
    from pathlib import Path

    import torch

FP8_MAX = 448.0  # the largest finite float8_e4m3fn; larger magnitudes saturate to it

# checkpoint tensor names of layer N's scales, in the order they are looked for
K_SCALE_NAMES = ("model.layers.{n}.self_attn.k_scale", "model.layers.{n}.self_attn.k_proj.k_scale",
                 "model.layers.{n}.self_attn.kv_scale")
V_SCALE_NAMES = ("model.layers.{n}.self_attn.v_scale", "model.layers.{n}.self_attn.v_proj.v_scale",
                 "model.layers.{n}.self_attn.kv_scale")


@dataclass(frozen=True)
class KVScales:
    """Static dequantization scales of each KV layer of a rank's pool (the same on every rank: a
    scale is per layer, not per head).

    Attributes:
        k: per KV layer (the model's, then its MTP layer's), the scale of K (MLA: of the latent).
        v: per KV layer, the scale of V (MLA: equal to ``k``).
    """

    k: tuple[float, ...]
    v: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.k) != len(self.v):
            raise ModelError(f"KV scales: {len(self.k)} k scales but {len(self.v)} v scales")
        for i, s in enumerate(self.k + self.v):
            if not (math.isfinite(s) and s > 0):
                raise ModelError(f"KV scale {s} of layer {i % len(self.k)} must be finite and > 0")

    @classmethod
    def unit(cls, num_layers: int) -> KVScales:
        """Scale 1.0 for every one of ``num_layers`` layers (vLLM's default without checkpoint scales)."""
        return cls((1.0,) * num_layers, (1.0,) * num_layers)


def read_kv_scales(directory: Path | None, num_layers: int, attention: str) -> KVScales:
    """The KV scales a checkpoint directory holds, 1.0 for each layer it has none for.

    Args:
        directory: a Hugging Face checkpoint directory, or None (random weights: every scale 1.0).
        num_layers: KV layers of the pool, the MTP layer's included (its checkpoint index follows the
            model's layers, as DeepSeek numbers it).
        attention: "gqa" or "mla" (MLA reads ``k_scale`` for its one latent cache).
    Returns:
        The scales.
    Raises:
        ModelError: a scale tensor that is not one positive finite number (the message names it).
    """
    if directory is None:
        return KVScales.unit(num_layers)
    from disaggsdk.engine.weights import checkpoint_files

    files = checkpoint_files(directory)
    k = tuple(_read_scale(files, name_forms=K_SCALE_NAMES, layer=n) for n in range(num_layers))
    v = k if attention == "mla" else tuple(_read_scale(files, V_SCALE_NAMES, n) for n in range(num_layers))
    return KVScales(k, v)


def _read_scale(files: dict[str, Path], name_forms: tuple[str, ...], layer: int) -> float:
    """The first of ``name_forms`` for ``layer`` the checkpoint has, as a float; else 1.0."""
    for form in name_forms:
        name = form.format(n=layer)
        if name in files:
            from safetensors import safe_open

            with safe_open(str(files[name]), framework="pt") as handle:
                tensor = handle.get_tensor(name)
            value = float(tensor.float().reshape(-1)[0]) if tensor.numel() == 1 else math.nan
            if not (math.isfinite(value) and value > 0):
                raise ModelError(
                    f"checkpoint tensor {name} (shape {list(tensor.shape)}) must be one positive finite fp8 KV "
                    f"scale; fix or drop it (without it the layer's scale is 1.0)"
                )
            return value
    return 1.0


def to_cache(x: torch.Tensor, cache_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Computed K/V (or latent) as the pages store it.

    Args:
        x: any shape, any float dtype.
        cache_dtype: the pool's element type.
        scale: the layer's scale (read only for float8_e4m3fn).
    Returns:
        ``x`` in ``cache_dtype``; fp8: ``x / scale`` saturated to +-448 and rounded to e4m3.
    """
    import torch

    if cache_dtype != torch.float8_e4m3fn:
        return x.to(cache_dtype)
    # saturate explicitly: whether a cast of an out-of-range value saturates or gives NaN is
    # the backend's choice, and one NaN in a page would poison every later query of its request
    return (x.float() / scale).clamp_(-FP8_MAX, FP8_MAX).to(cache_dtype)


def from_cache(stored: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    """Stored K/V (or latent) as values to compute with.

    Args:
        stored: pages or a gathered copy of them, in the pool's element type.
        dtype: the compute dtype (the query's).
        scale: the layer's scale (read only for float8_e4m3fn).
    Returns:
        ``stored`` in ``dtype``; fp8: ``stored.float() * scale`` (as the native kernel computes it).
    """
    import torch

    if stored.dtype != torch.float8_e4m3fn:
        return stored.to(dtype)
    return (stored.float() * scale).to(dtype)
