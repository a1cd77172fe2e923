"""The matmuls of decoding, with caches as cold as a decode step leaves them: ``F.linear`` against
`engine.modeling.layers.skinny.linear` (bfloat16: on the packed AMX kernel where this CPU has AMX,
``"amx": true``), and the memory-bandwidth bound of each.

    python -m disaggsdk.bench.skinny_gemm [--rows 1 --rows 2 ...] [--threads 2] [--repeats 200]
        [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# (out_features, in_features): lm_head 4096 x 256, MLP up|gate 1024 x 256 and down 256 x 512,
# attention 256 x 256, MoE experts 256 x 128
SHAPES = ((4096, 256), (1024, 256), (256, 512), (256, 256), (256, 128))
EVICT_BYTES = 64 << 20


def _mean_us(fn: Callable[[], object], evict: torch.Tensor, repeats: int) -> float:
    total = 0.0
    for i in range(repeats + 5):
        evict.add_(1.0)
        start = time.perf_counter()
        fn()
        if i >= 5:  # the first calls pay for allocation and dispatch warm-up
            total += time.perf_counter() - start
    return total / repeats * 1e6


def run_skinny_gemm(rows: list[int], repeats: int = 200, dtype: str = "float32") -> dict[str, Any]:
    """The comparison for every shape and row count (see the module docstring), weights and x in
    ``dtype`` (float32 or bfloat16: oneDNN's matmuls)."""
    import torch
    import torch.nn.functional as F

    from disaggsdk.engine.modeling.layers import amx_linear, skinny

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    evict = torch.zeros(EVICT_BYTES // 4)
    results = []
    for out_features, in_features in SHAPES:
        weight = torch.randn(out_features, in_features).to(torch_dtype)
        packed = amx_linear.pack_if_useful(weight)  # as a bfloat16 model's layers pack it at load
        for n in rows:
            x = torch.randn(n, in_features).to(torch_dtype)
            tolerance = 1e-4 if dtype == "float32" else 2e-2
            torch.testing.assert_close(skinny.linear(x, weight, packed), F.linear(x, weight), rtol=tolerance,
                                       atol=tolerance)
            # each call binds this iteration's tensors
            linear_us = _mean_us(partial(F.linear, x, weight), evict, repeats)
            skinny_us = _mean_us(partial(skinny.linear, x, weight, packed), evict, repeats)
            weight_gb = weight.numel() * weight.element_size() / 1e9
            results.append({
                "weight": [out_features, in_features], "rows": n,
                "f_linear_us": round(linear_us, 1), "skinny_us": round(skinny_us, 1),
                "speedup": round(linear_us / skinny_us, 2),
                "f_linear_weight_gb_per_s": round(weight_gb / (linear_us * 1e-6), 1),
                "skinny_weight_gb_per_s": round(weight_gb / (skinny_us * 1e-6), 1),
            })
    return {"threads": torch.get_num_threads(), "dtype": dtype, "amx": dtype == "bfloat16" and amx_linear.available(),
            "results": results}


def main(argv: list[str] | None = None) -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, action="append", help="rows of x (repeatable; default 1 2 4 8 16 32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(json.dumps(run_skinny_gemm(a.rows or [1, 2, 4, 8, 16, 32], a.repeats, a.dtype), indent=1))


if __name__ == "__main__":
    main()
