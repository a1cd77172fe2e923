"""Rotary position embedding: default and YaRN frequencies, half-split and interleaved pairs.

Numbers follow transformers 5 (`modeling_rope_utils`): cos/sin are ``cat(freqs, freqs)`` scaled
by YaRN's attention factor. DeepSeek additionally multiplies the softmax scale by
``yarn_mscale(factor, mscale_all_dim) ** 2`` (see `softmax_scale_factor`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from disaggsdk.errors import ModelError

SUPPORTED_ROPE_TYPES = ("default", "yarn")


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """The rope settings of a config.json, in transformers 5's ``rope_parameters`` form.

    Older configs put ``rope_theta`` at the top and the scaling under ``rope_scaling`` with a
    ``type`` key; both spellings are read.

    Raises:
        ModelError: a rope type other than default or yarn (names the field).
    """
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    if params["rope_type"] not in SUPPORTED_ROPE_TYPES:
        raise ModelError(f"config.json field 'rope_scaling.type' is {params['rope_type']!r}; the engine supports "
                         f"{list(SUPPORTED_ROPE_TYPES)}")
    if params["rope_type"] == "yarn":
        params.setdefault("original_max_position_embeddings", config.get("max_position_embeddings"))
    return params


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction for a context stretched ``scale`` times."""
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def softmax_scale_factor(params: dict[str, Any]) -> float:
    """DeepSeek's extra softmax-scale factor under YaRN (1.0 without scaling)."""
    if params["rope_type"] == "default":
        return 1.0
    mscale_all_dim = params.get("mscale_all_dim") or 0
    if not mscale_all_dim:
        return 1.0
    m = yarn_mscale(params["factor"], mscale_all_dim)
    return m * m


def _yarn(params: dict[str, Any], dim: int, max_position_embeddings: int) -> tuple[torch.Tensor, float]:
    base = params["rope_theta"]
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_position_embeddings / original
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # share of the original (extrapolated) frequency
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for positions, applied to q and k (no weights)."""

    inv_freq: torch.Tensor  # a buffer: [dim // 2], float32

    def __init__(self, dim: int, params: dict[str, Any], max_position_embeddings: int, interleaved: bool = False):
        super().__init__()
        self.dim = dim
        self.interleaved = interleaved
        if params["rope_type"] == "yarn":
            inv_freq, self.attention_factor = _yarn(params, dim, max_position_embeddings)
        else:
            base = params["rope_theta"]
            inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
            self.attention_factor = 1.0
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # [dim // 2], float32

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, each [num_tokens, dim] in ``dtype``, for int64 ``positions`` [num_tokens]."""
        freqs = positions[:, None].float() * self.inv_freq.to(positions.device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_factor).to(dtype), (emb.sin() * self.attention_factor).to(dtype)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` [num_tokens, heads, dim] by position.

        Half-split (Qwen): dims i and i + dim/2 form a pair. Interleaved (DeepSeek): dims 2i and
        2i + 1 form a pair, and the result comes out half-split, exactly as transformers returns
        it; q and k get the same permutation, so their dot products are unchanged.
        """
        cos = cos[:, None, :]
        sin = sin[:, None, :]
        if self.interleaved:
            half = self.dim // 2
            c, s = cos[..., :half], sin[..., :half]
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin
