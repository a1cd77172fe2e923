"""A block-FP8 linear layer, y = x W^T with W in FP8 and one scale per 128 x 128 block: a CUDA path and its CPU twin."""

from __future__ import annotations

import math

import torch

from disaggsdk.engine.fp8_blocks import dequantize_blocks, expand_scales, quantize_blocks

GROUP_COLS = 128  # activation columns per scale (1 x 128), as DeepSeek's act_quant
CUDA_BLOCK = (128, 128)  # the only weight block cuBLAS' blockwise recipe takes


def quantize_activations(x: torch.Tensor, group_cols: int = GROUP_COLS) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group FP8 of activations (1 x ``group_cols``): scale = group amax / 448.

    Args:
        x: [M, K], any float dtype, any device.
        group_cols: columns per scale; the last group is ragged where it does not divide K.
    Returns:
        (x_fp8 [M, K] float8_e4m3fn, scale [M, ceil(K / group_cols)] float32), x ~= x_fp8 * scale per
        group; an all-zero group gets scale 1.
    """
    return quantize_blocks(x, (1, group_cols))  # one token's group is a block of one row


def blockwise_fp8_linear_reference(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                                   block: tuple[int, int] = CUDA_BLOCK,
                                   out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """y = x W^T in block FP8, with plain torch (the CPU twin and the oracle of the CUDA path).

    Args:
        x: [M, K] activations, any float dtype.
        weight: [N, K] float8_e4m3fn.
        weight_scale_inv: [ceil(N / br), ceil(K / bc)] float32 or bfloat16.
        block: (br, bc) of the weight's scales; ragged last blocks are fine here.
        out_dtype: dtype of y.
    Returns:
        [M, N] in ``out_dtype``: the FP8-quantized activations times the dequantized weight, in float32.
    """
    x_fp8, x_scale = quantize_activations(x, block[1])
    x_values = x_fp8.float() * expand_scales(x_scale, tuple(x.shape), (1, block[1]))  # type: ignore[arg-type]
    return (x_values @ dequantize_blocks(weight, weight_scale_inv, block).t()).to(out_dtype)


def cuda_unsupported_reason(weight_shape: tuple[int, int], block: tuple[int, int], device: torch.device) -> str | None:
    """Why `blockwise_fp8_linear_cuda` cannot run this weight here, or None when it can.

    Args:
        weight_shape: [N, K] of the FP8 weight.
        block: its scale block (br, bc).
        device: where the operands are.
    """
    n, k = weight_shape
    if tuple(block) != CUDA_BLOCK:
        return f"cuBLAS blockwise FP8 takes 128x128 weight blocks, not {block[0]}x{block[1]}"
    if n % 128 or k % 128:
        return f"cuBLAS blockwise FP8 needs N and K divisible by 128, got a [{n}, {k}] weight"
    if device.type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"cuBLAS' DeepSeek-style block scaling runs on sm90 only, not sm{major}{minor}"
    version = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    if version < (12, 9):
        return f"cuBLAS blockwise FP8 needs CUDA 12.9 or newer, torch is built with {torch.version.cuda}"
    return None


def scaled_mm_operands(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four tensors ``scaled_mm`` takes for (BlockWise1x128 x BlockWise128x128), in the layouts it requires.

    Args:
        x: [M, K], K a multiple of 128.
        weight: [N, K] float8_e4m3fn, N a multiple of 128.
        weight_scale_inv: [N / 128, K / 128].
    Returns:
        (x_fp8 [M, K] row-major, weight^T [K, N] column-major (a view), x scales [M, K / 128] float32
        with strides [1, M], weight scales [L4, N / 128] float32 with strides [1, L4], where L4 rounds
        K / 128 up to a multiple of 4 and the padding columns are ones).
    """
    x_fp8, x_scale = quantize_activations(x.contiguous())
    # outer-dim-major, as cuBLAS reads 1 x 128 scales; built explicitly because for M = 1 torch counts
    # any strides as contiguous and `.t().contiguous().t()` would keep the row-major ones
    m = x_scale.shape[0]
    scale_a = torch.empty_strided(tuple(x_scale.shape), (1, max(m, 1)), dtype=torch.float32, device=x_scale.device)
    scale_a.copy_(x_scale)
    n_blocks, k_blocks = weight_scale_inv.shape
    l4 = 4 * math.ceil(k_blocks / 4)
    padded = torch.ones(n_blocks, l4, dtype=torch.float32, device=weight_scale_inv.device)
    padded[:, :k_blocks] = weight_scale_inv.float()
    return x_fp8, weight.t(), scale_a, padded.t()


def blockwise_fp8_linear_cuda(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                              out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """y = x W^T on the GPU's FP8 tensor cores (torch ``scaled_mm``, cuBLASLt blockwise scaling).

    Args and returns as `blockwise_fp8_linear_reference` with ``block`` (128, 128).
    Raises:
        ValueError: this weight or device cannot take this path (`cuda_unsupported_reason` says why).
    """
    from torch.nn.functional import ScalingType, scaled_mm

    reason = cuda_unsupported_reason(tuple(weight.shape), CUDA_BLOCK, x.device)  # type: ignore[arg-type]
    if reason is not None:
        raise ValueError(f"blockwise_fp8_linear_cuda: {reason}; use blockwise_fp8_linear_reference")
    x_fp8, mat_b, scale_a, scale_b = scaled_mm_operands(x, weight, weight_scale_inv)
    return scaled_mm(x_fp8, mat_b, scale_a, ScalingType.BlockWise1x128, scale_b, ScalingType.BlockWise128x128,
                     output_dtype=out_dtype)
