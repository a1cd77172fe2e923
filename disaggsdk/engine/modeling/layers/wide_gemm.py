"""y = x W^T for the many-row products of prefill, through the GEMM library that is faster on this CPU."""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch
import torch.nn.functional as F

from disaggsdk.engine.modeling.layers.gemm_timing import best_time_s, float32_cpu_weights

MODE_ENV = "DISAGGSDK_WIDE_GEMM"  # auto (default) | mkl | onednn
MIN_GAIN = 0.9  # oneDNN is kept only below this fraction of F.linear's time
CALIBRATION_ROWS = 512  # a prefill chunk's worth of rows
CALIBRATION_CALLS = 4  # timed calls per library and round; the best of 3 rounds counts

# (out_features, in_features) -> whether oneDNN is faster here (calibrate)
_onednn_faster: dict[tuple[int, int], bool] = {}


def mode() -> str:
    """``DISAGGSDK_WIDE_GEMM``: auto, mkl or onednn (anything else reads as auto)."""
    value = os.environ.get(MODE_ENV, "auto")
    return value if value in ("mkl", "onednn") else "auto"


MODE = mode()  # read once: a compiled graph is traced with the choice as a constant


# Read once: a call to torch.backends inside the compiled step broke its graph into pieces (a
# whole-model run on two threads went from 5,900 to 3,400 tokens/s).
_ONEDNN_AVAILABLE = torch.backends.mkldnn.is_available()


def onednn_available() -> bool:
    """Whether torch was built with oneDNN (mkldnn) and it runs on this CPU."""
    return _ONEDNN_AVAILABLE


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [None], "")


_LIBRARY = torch.library.Library("disaggsdk", "FRAGMENT")
_LIBRARY.define("onednn_linear(Tensor x, Tensor weight) -> Tensor")
_LIBRARY.impl("onednn_linear", _onednn_linear, "CPU")


@torch.library.register_fake("disaggsdk::onednn_linear", lib=_LIBRARY)
def _(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def calibrate(weights: Iterable[torch.Tensor]) -> dict[tuple[int, int], bool]:
    """Time MKL (``F.linear``) and oneDNN on each new float32 CPU weight shape (a 3-D stack of
    experts counts as its [out, in] slices), `CALIBRATION_ROWS` rows, and remember for this process
    whether oneDNN is faster. Does nothing unless the mode is auto and oneDNN is available.
    Returns the choices made so far: (out_features, in_features) -> oneDNN."""
    if MODE != "auto" or not onednn_available():
        return dict(_onednn_faster)
    with torch.inference_mode():
        for w in float32_cpu_weights(weights):
            key = (w.shape[0], w.shape[1])
            if key in _onednn_faster:
                continue
            x = torch.randn(CALIBRATION_ROWS, w.shape[1])
            _onednn_faster[key] = (best_time_s(_onednn_linear, x, w, CALIBRATION_CALLS)
                                   < MIN_GAIN * best_time_s(F.linear, x, w, CALIBRATION_CALLS))
    return dict(_onednn_faster)


def uses_onednn(weight: torch.Tensor) -> bool:
    """Whether `linear` sends a float32 CPU product with this weight to oneDNN."""
    if MODE == "mkl" or weight.dtype != torch.float32 or weight.device.type != "cpu" or not onednn_available():
        return False
    return MODE == "onednn" or _onednn_faster.get((weight.shape[0], weight.shape[1]), False)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, weight)`` (no bias) for a prefill's many rows, on the library chosen for this
    weight's shape (see the module docstring).

    Args:
        x: [rows, in_features].
        weight: [out_features, in_features].
    Returns:
        [rows, out_features]; equal to ``F.linear`` up to float rounding.
    """
    if x.dim() == 2 and x.dtype == torch.float32 and uses_onednn(weight):
        return torch.ops.disaggsdk.onednn_linear(x, weight)
    return F.linear(x, weight)
