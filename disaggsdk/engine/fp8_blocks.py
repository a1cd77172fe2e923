"""Block-scaled FP8 tensors: quantize, dequantize, and read one rank's slice of a checkpoint tensor.

A block-FP8 weight (DeepSeek-V3/R1, Qwen3-*-FP8; which tensors, see `disaggsdk.models.quantization`)
is ``weight`` [out, in] float8_e4m3fn and ``weight_scale_inv`` [ceil(out / br), ceil(in / bc)]; the
real weight is ``weight.float() * scale`` with each scale broadcast over its br x bc block, the last
block of a dimension that the block size does not divide being ragged (fewer rows or columns).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from disaggsdk.errors import ModelError
from disaggsdk.models.quantization import FP8_MAX

if TYPE_CHECKING:
    from disaggsdk.engine.weights import SafetensorsSlice

# safetensors' dtype names of the two float8 formats: either stored without its scale is a bug to refuse
FP8_DTYPE_NAMES = ("F8_E4M3", "F8_E5M2")
# what a scale tensor may be stored as (DeepSeek: float32; some Qwen FP8 releases: bfloat16)
SCALE_DTYPE_NAMES = ("F32", "BF16")


def expand_scales(scale_inv: torch.Tensor, shape: tuple[int, int], block: tuple[int, int]) -> torch.Tensor:
    """One scale per element: ``scale_inv`` [ceil(rows / br), ceil(cols / bc)] repeated over its blocks
    and cropped to ``shape`` [rows, cols] (the ragged last blocks), as float32."""
    rows, cols = shape
    br, bc = block
    full = scale_inv.float().repeat_interleave(br, dim=0).repeat_interleave(bc, dim=1)
    return full[:rows, :cols]


def dequantize_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The real values of a block-FP8 tensor.

    Args:
        weight: [rows, cols], float8_e4m3fn (or any dtype: it is read as float32).
        scale_inv: [ceil(rows / br), ceil(cols / bc)], float32 or bfloat16: one scale per block.
        block: (br, bc), the rows and columns one scale covers.
    Returns:
        [rows, cols] float32, ``weight * scale`` block by block.
    Raises:
        ModelError: ``scale_inv`` is not the shape the weight and block imply.
    """
    rows, cols = weight.shape
    want = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(scale_inv.shape) != want:
        raise ModelError(f"a [{rows}, {cols}] weight with {block[0]}x{block[1]} blocks needs a scale of shape "
                         f"{list(want)}, got {list(scale_inv.shape)}")
    return weight.float() * expand_scales(scale_inv, (rows, cols), block)


def quantize_blocks(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-FP8 of a weight, as DeepSeek's quantizer makes it: scale = block amax / 448.

    Args:
        weight: [rows, cols], any float dtype.
        block: (br, bc); the last blocks are ragged where br or bc does not divide the shape.
    Returns:
        (fp8 [rows, cols] float8_e4m3fn, scale_inv [ceil(rows / br), ceil(cols / bc)] float32), with
        ``dequantize_blocks(fp8, scale_inv, block)`` close to ``weight``. An all-zero block gets scale 1
        (its fp8 values are 0 either way; a scale of 0 would make the division undefined).
    """
    rows, cols = weight.shape
    br, bc = block
    nr, nc = math.ceil(rows / br), math.ceil(cols / bc)
    w = weight.float()
    # pad to whole blocks with zeros, which change no block's amax
    padded = torch.zeros(nr * br, nc * bc, dtype=torch.float32, device=w.device)
    padded[:rows, :cols] = w
    amax = padded.view(nr, br, nc, bc).abs().amax(dim=(1, 3))  # [nr, nc]
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    scaled = w / expand_scales(scale_inv, (rows, cols), block)
    fp8 = scaled.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return fp8, scale_inv


def read_dequantized(weight: SafetensorsSlice, scale_inv: SafetensorsSlice, block: tuple[int, int],
                     shard_dim: int | None, shard: tuple[int, int]) -> torch.Tensor:
    """This rank's slice of a block-FP8 checkpoint tensor, dequantized, reading no more than whole blocks.

    Args:
        weight: the lazily read fp8 tensor [rows, cols] (``safe_open(...).get_slice(name)``).
        scale_inv: its lazily read scale [ceil(rows / br), ceil(cols / bc)] (shape checked by the caller).
        block: (br, bc).
        shard_dim: the dimension this rank keeps a range of, or None for the whole tensor.
        shard: [start, stop) along ``shard_dim``.
    Returns:
        float32, the tensor's shape with ``shard_dim`` cut to ``stop - start``: exactly those rows
        (or columns) of ``dequantize_blocks`` of the whole tensor.
    """
    rows, cols = weight.get_shape()
    if shard_dim is None:
        return dequantize_blocks(weight[:, :], scale_inv[:, :], block)
    start, stop = shard
    size = block[shard_dim]
    first_block, end_block = start // size, math.ceil(stop / size)
    # whole blocks around [start, stop), the last one ragged where the tensor ends
    lo, hi = first_block * size, min(end_block * size, (rows, cols)[shard_dim])
    if shard_dim == 0:
        values = dequantize_blocks(weight[lo:hi, :], scale_inv[first_block:end_block, :], block)
        return values[start - lo: stop - lo]
    values = dequantize_blocks(weight[:, lo:hi], scale_inv[:, first_block:end_block], block)
    return values[:, start - lo: stop - lo]
