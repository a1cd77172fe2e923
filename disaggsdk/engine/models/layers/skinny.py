"""y = x W^T for the few-row inputs of decoding and verification, in the GEMM orientation that is
fast on a CPU.

A decode step multiplies 1 to a few dozen rows by every weight of the model, and the weights do not
stay in cache from one step to the next: the step is bound by reading them. On this machine
(MKL's float32 GEMM, 2 cores; ``python -m disaggsdk.bench.skinny_gemm`` measures it) ``F.linear(x, W)``
with W row-major reads W far slower than the same product computed as ``(W @ x.T).T``: with cold
caches, for x of 2 rows and W of 4096 x 256, 539 us against 132 us, and ``(W @ x.T).T`` stays ahead
up to 32 rows. It also makes 2 to 8 rows cost about what 1 row does, which is what speculative
verification (k + 1 rows per request) needs. A single row goes through GEMV, which is as slow as
``F.linear`` on large weights; duplicating the row makes it a 2-column GEMM (142 against 505 us for
4096 x 256), worth it from a quarter million elements. Other dtypes and devices keep ``F.linear`` (bfloat16 runs on oneDNN, whose cost is
already flat in the rows; GPUs have their own kernels).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MAX_ROWS = 32  # measured ahead of F.linear up to here
MIN_PADDED_NUMEL = 1 << 18  # one row is duplicated only for weights this large (smaller: no gain)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` (no bias), faster for float32 CPU inputs of at most `MAX_ROWS` rows.

    Args:
        x: [rows, in_features].
        weight: [out_features, in_features].
    Returns:
        [rows, out_features], contiguous; equal to ``F.linear`` up to float rounding.
    """
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu" or x.shape[0] > MAX_ROWS:
        return F.linear(x, weight)
    if x.shape[0] == 1:
        if weight.numel() < MIN_PADDED_NUMEL:
            return F.linear(x, weight)
        return (weight @ torch.cat([x, x]).t())[:, :1].t().contiguous()
    return (weight @ x.t()).t().contiguous()
