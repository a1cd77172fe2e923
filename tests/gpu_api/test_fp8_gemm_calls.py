"""The block-FP8 GEMM's call of torch's ``scaled_mm`` binds to the installed torch (CPU, no GPU).

`blockwise_fp8_linear_cuda` runs as it would on an sm90 GPU (its device check lifted) up to the
GEMM, which is a stand-in bound to torch's own ``scaled_mm`` signature and annotations (the
operands' layouts are tested against torch's rules in tests/engine/test_fp8_linear.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional

from disaggsdk.engine import fp8_linear
from disaggsdk.engine.fp8_blocks import quantize_blocks
from tests.gpu_api.installed_signatures import ApiCall, CallRecorder, InstanceStandIn, Rules, stand_in


def _product(call: ApiCall, instance: InstanceStandIn | None) -> torch.Tensor:
    mat_a, mat_b = call.arguments["mat_a"], call.arguments["mat_b"]
    return torch.zeros(mat_a.shape[0], mat_b.shape[1], dtype=call.arguments["output_dtype"])  # type: ignore[union-attr]


def test_the_cuda_path_calls_the_installed_scaled_mm(monkeypatch):
    recorder = CallRecorder(Rules(), {"scaled_mm": _product})
    monkeypatch.setattr(torch.nn.functional, "scaled_mm", stand_in(torch.nn.functional.scaled_mm, recorder))
    monkeypatch.setattr(fp8_linear, "cuda_unsupported_reason", lambda shape, block, device: None)
    weight, weight_scale_inv = quantize_blocks(torch.randn(256, 384), (128, 128))
    y = fp8_linear.blockwise_fp8_linear_cuda(torch.randn(5, 384), weight, weight_scale_inv, out_dtype=torch.bfloat16)
    assert y.shape == (5, 256) and y.dtype == torch.bfloat16
    (call,) = recorder.named("scaled_mm")
    recipes = (call.arguments["scale_recipe_a"], call.arguments["scale_recipe_b"])
    assert recipes == (torch.nn.functional.ScalingType.BlockWise1x128, torch.nn.functional.ScalingType.BlockWise128x128)
