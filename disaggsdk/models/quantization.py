"""Block-scaled FP8 checkpoints as DeepSeek-V3/R1 and Qwen3-*-FP8 ship them: which tensors are FP8, and their scales.

The format (``config.json``: ``quantization_config: {quant_method: fp8, fmt: e4m3, weight_block_size:
[128, 128], activation_scheme: dynamic}``): every quantized linear weight ``X.weight`` [out, in] is
stored as float8_e4m3fn, beside ``X.weight_scale_inv`` [ceil(out / 128), ceil(in / 128)] holding one
scale per 128 x 128 block (float32 in DeepSeek's files, bfloat16 in some Qwen ones); the real weight is
``fp8 * scale`` (the name says "inverse" because the quantizer divided by it). The last block of a
dimension that 128 does not divide is ragged: its scale covers fewer rows or columns.
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs

from disaggsdk.errors import ModelError

SCALE_SUFFIX = "weight_scale_inv"
FP8_MAX = 448.0  # largest finite float8_e4m3fn

# Linear weights that stay in the checkpoint's 16-bit dtype (matched against the tensor name).
_NEVER_QUANTIZED = re.compile(
    r"(^|\.)(embed_tokens|lm_head|shared_head\.head|eh_proj|mlp\.gate)\.weight$|norm\.weight$"
)


@attrs.frozen
class BlockFP8:
    """A checkpoint's block-FP8 format (its ``quantization_config``)."""

    block_rows: int = 128  # output features per scale block
    block_cols: int = 128  # input features per scale block
    modules_to_not_convert: tuple[str, ...] = ()

    def scale_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, int]:
        """The ``weight_scale_inv`` shape of a [out, in] weight (ragged last blocks round up)."""
        rows, cols = weight_shape
        return math.ceil(rows / self.block_rows), math.ceil(cols / self.block_cols)

    def is_quantized(self, name: str, shape: tuple[int, ...]) -> bool:
        """Whether checkpoint tensor ``name`` of ``shape`` is stored in FP8 with a block scale."""
        if len(shape) != 2 or not name.endswith(".weight") or _NEVER_QUANTIZED.search(name):
            return False
        module = name[: -len(".weight")]
        return not any(module == m or module.endswith("." + m) or module.startswith(m + ".")
                       for m in self.modules_to_not_convert)


def scale_name(weight_name: str) -> str:
    """The scale tensor's name of quantized weight ``weight_name`` (``X.weight`` -> ``X.weight_scale_inv``)."""
    assert weight_name.endswith(".weight"), weight_name
    return weight_name[: -len("weight")] + SCALE_SUFFIX


def block_fp8_of(config: dict[str, Any], name: str = "model") -> BlockFP8 | None:
    """The block-FP8 format a config.json declares, or None for an unquantized checkpoint.

    Raises:
        ModelError: a ``quantization_config`` this engine cannot load (another method, format or
            block shape); the message says what it found and what is supported.
    """
    quant = config.get("quantization_config")
    if not quant:
        return None
    method = quant.get("quant_method")
    if method != "fp8":
        raise ModelError(f"{name}: config.json quantization_config.quant_method is {method!r}; only block-scaled "
                         f"'fp8' checkpoints (DeepSeek-V3/R1, Qwen3-*-FP8) load, or use the unquantized checkpoint")
    fmt = quant.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ModelError(f"{name}: quantization_config.fmt is {fmt!r}; only 'e4m3' (float8_e4m3fn) is supported")
    block = quant.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ModelError(f"{name}: quantization_config.weight_block_size is {block!r}; block-scaled fp8 needs "
                         f"[rows, cols] such as [128, 128] (per-tensor fp8 is not supported)")
    skip = quant.get("modules_to_not_convert") or quant.get("ignored_layers") or ()
    return BlockFP8(block[0], block[1], tuple(str(m) for m in skip))


def block_fp8_config(block_size: int = 128) -> dict[str, Any]:
    """The ``quantization_config`` entry DeepSeek-V3/R1 ship (what the FP8 writer puts in config.json)."""
    return {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
            "weight_block_size": [block_size, block_size]}
