"""Timing two ways of one matmul at engine start, for the choices that depend on the CPU at hand
(`skinny`: the orientation of decoding's few-row products; `wide_gemm`: the library of prefill's)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

import torch


def best_time_s(fn: Callable[[torch.Tensor, torch.Tensor], object], x: torch.Tensor, weight: torch.Tensor,
                calls: int) -> float:
    """The best of 3 rounds of ``calls`` calls of ``fn(x, weight)``, in seconds, after one untimed call
    (which pays for allocation and, in oneDNN, for building the primitive)."""
    fn(x, weight)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x, weight)
        best = min(best, time.perf_counter() - start)
    return best


def float32_cpu_weights(weights: Iterable[torch.Tensor]) -> Iterator[torch.Tensor]:
    """The [out, in] float32 CPU matrices among ``weights``: 2-D ones as they are, a 3-D stack of
    experts as its first slice (its experts share the shape); anything else is skipped."""
    for w in weights:
        if w.dtype == torch.float32 and w.device.type == "cpu" and w.dim() in (2, 3):
            yield w if w.dim() == 2 else w[0]
