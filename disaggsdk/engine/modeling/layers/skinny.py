"""y = x W^T for the few-row inputs of decoding and verification, in the GEMM orientation that is
fast on a CPU.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from disaggsdk.engine.modeling.layers import wide_gemm
from disaggsdk.engine.modeling.layers.gemm_timing import best_time_s, float32_cpu_weights

MAX_ROWS = 32  # measured ahead of F.linear up to here
MIN_PADDED_NUMEL = 1 << 18  # one row is duplicated only for weights this large (smaller: no gain)
MODE_ENV = "DISAGGSDK_SKINNY"  # auto (default) | on | off
MIN_GAIN = 0.9  # the transposed form is kept only below this fraction of F.linear's time
CALIBRATION_ROWS = (1, 4)  # one row (the one-row rule), and a few (standing for 2..MAX_ROWS)
CALIBRATION_CALLS = 8  # timed calls per form and round; the best of 3 rounds counts

# (out_features, in_features, one_row) -> whether the transposed form is faster here (calibrate)
_faster: dict[tuple[int, int, bool], bool] = {}


def mode() -> str:
    """``DISAGGSDK_SKINNY``: auto, on or off (anything else reads as auto)."""
    value = os.environ.get(MODE_ENV, "auto")
    return value if value in ("on", "off") else "auto"


MODE = mode()  # read once: a compiled graph is traced with the choice as a constant


def _rule(weight: torch.Tensor, one_row: bool) -> bool:
    """The fixed rule ("on", and "auto" before calibration): few rows always, one row for large weights."""
    return not one_row or weight.numel() >= MIN_PADDED_NUMEL


def _transposed(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if x.shape[0] == 1:
        return (weight @ torch.cat([x, x]).t())[:, :1].t().contiguous()
    return (weight @ x.t()).t().contiguous()


def calibrate(weights: Iterable[torch.Tensor]) -> dict[tuple[int, int, bool], bool]:
    """Time ``F.linear`` and the transposed form on each new weight shape (float32 CPU ones; a 3-D
    stack of experts counts as its [out, in] slices), one row and a few, and remember the faster for
    this process. Does nothing unless the mode is auto. Returns the choices made so far."""
    if MODE != "auto":
        return dict(_faster)
    with torch.inference_mode():
        for w in float32_cpu_weights(weights):
            for rows in CALIBRATION_ROWS:
                key = (w.shape[0], w.shape[1], rows == 1)
                if key in _faster or (rows == 1 and not _rule(w, True)):
                    continue
                x = torch.randn(rows, w.shape[1])
                _faster[key] = (best_time_s(_transposed, x, w, CALIBRATION_CALLS)
                                < MIN_GAIN * best_time_s(F.linear, x, w, CALIBRATION_CALLS))
    return dict(_faster)


def linear(x: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight)`` (no bias), faster for CPU inputs of at most `MAX_ROWS` rows: float32
    in the orientation above, bfloat16 on the AMX kernel where ``packed`` is given; float32 products
    of more rows on the GEMM library `wide_gemm` chose for this CPU.

    Args:
        x: [rows, in_features].
        weight: [out_features, in_features].
        packed: ``amx_linear.pack(weight)``, or None.
    Returns:
        [rows, out_features], contiguous; equal to ``F.linear`` up to float rounding.
    """
    if packed is not None and x.dim() == 2 and x.dtype == torch.bfloat16 and x.shape[0] <= MAX_ROWS:
        return torch.ops.disaggsdk.amx_linear(x, packed)
    if x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, weight)
    if x.shape[0] > MAX_ROWS:  # a prefill's product: MKL or oneDNN, whichever is faster here
        return wide_gemm.linear(x, weight)
    # a branch, not ``one_row = x.shape[0] == 1``: under the compiled step's dynamic shapes that is a
    # symbolic bool, which torch 2.14 cannot compare with `_faster`'s keys ("BooleanAtom not allowed in
    # this context"); on a branch dynamo guards on the row count and goes on with a constant
    one_row = True if x.shape[0] == 1 else False
    if MODE == "off" or not _rule(weight, one_row):
        return F.linear(x, weight)
    if MODE == "auto" and not _faster.get((weight.shape[0], weight.shape[1], one_row), True):
        return F.linear(x, weight)
    return _transposed(x, weight)
