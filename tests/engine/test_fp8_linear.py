"""The block-FP8 linear: the CPU twin computes DeepSeek's recipe, the CUDA path's operands meet torch's
own shape and stride rules for blockwise ``scaled_mm`` (checked on CPU with meta tensors), and on a
GPU (``gpu`` marker) the CUDA path gives the twin's output."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.nn.functional import ScalingType, scaled_mm  # noqa: E402

from disaggsdk.engine.fp8_blocks import quantize_blocks  # noqa: E402
from disaggsdk.engine.fp8_linear import (  # noqa: E402
    blockwise_fp8_linear_cuda,
    blockwise_fp8_linear_reference,
    cuda_unsupported_reason,
    quantize_activations,
    scaled_mm_operands,
)
from tests.declared_skips import no_gpu  # noqa: E402


def operands(m: int, n: int, k: int, device: str = "cpu", seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    weight, scale = quantize_blocks(torch.randn(n, k, generator=gen) * 0.05, (128, 128))
    return x.to(device), weight.to(device), scale.to(device)


def test_activations_are_quantized_per_row_and_128_columns():
    x = torch.randn(3, 200)
    x[1, 128:] *= 1000  # a large ragged last group: only its own scale grows
    x[2, :128] = 0
    x_fp8, scale = quantize_activations(x)
    assert x_fp8.dtype == torch.float8_e4m3fn and scale.shape == (3, 2) and scale[2, 0] == 1.0
    assert torch.allclose(scale[1, 1], x[1, 128:].abs().max() / 448)
    assert torch.allclose(scale[1, 0], x[1, :128].abs().max() / 448)
    back = x_fp8.float() * scale.repeat_interleave(128, 1)[:, :200]
    assert ((back - x).abs() <= scale.repeat_interleave(128, 1)[:, :200] * 448 / 16 + 1e-6).all()


@pytest.mark.parametrize("m,n,k", [(1, 256, 384), (7, 80, 200)])  # the second: ragged weight and activation blocks
def test_the_cpu_twin_is_the_product_of_the_dequantized_operands(m, n, k):
    x, weight, scale = operands(m, n, k)
    y = blockwise_fp8_linear_reference(x, weight, scale, out_dtype=torch.float32)
    dense = x @ (weight.float() * scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]).t()
    # only the activations' FP8 rounding separates it from the dense product (3 mantissa bits)
    assert y.shape == (m, n) and not torch.equal(y, dense)
    torch.testing.assert_close(y, dense, atol=0.05 * dense.abs().max().item(), rtol=0.1)
    assert blockwise_fp8_linear_reference(x, weight, scale).dtype == torch.bfloat16


@pytest.mark.parametrize("m,n,k", [(1, 768, 1280), (5, 256, 384), (130, 128, 512)])
def test_cuda_operands_meet_torch_blockwise_scaled_mm_rules(m, n, k):
    # on meta tensors torch runs the CUDA shape and stride checks of scaled_mm without a GPU;
    # K / 128 = 10 and 3 need the weight scales padded to a multiple of 4 columns
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    weight = torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta")
    scale = torch.empty(n // 128, k // 128, device="meta")
    a, b, scale_a, scale_b = scaled_mm_operands(x, weight, scale)
    y = scaled_mm(a, b, scale_a, ScalingType.BlockWise1x128, scale_b, ScalingType.BlockWise128x128,
                  output_dtype=torch.bfloat16)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    # the check is real: row-major activation scales (the layout quantize_activations returns) fail it
    with pytest.raises(RuntimeError, match="1x128 x 128x128 blockwise scaling"):
        scaled_mm(a, b, scale_a.contiguous() if m > 1 else scale_a, ScalingType.BlockWise1x128,
                  scale_b.contiguous(), ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)


def test_cuda_path_says_why_it_cannot_run():
    cpu = torch.device("cpu")
    assert "128x128 weight blocks" in cuda_unsupported_reason((256, 256), (64, 64), cpu)
    assert "divisible by 128" in cuda_unsupported_reason((80, 256), (128, 128), cpu)
    assert "CUDA device" in cuda_unsupported_reason((256, 256), (128, 128), cpu)
    x, weight, scale = operands(2, 128, 128)
    with pytest.raises(ValueError, match="use blockwise_fp8_linear_reference"):
        blockwise_fp8_linear_cuda(x, weight, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 256, 384), (33, 768, 1280), (256, 512, 512)])
def test_cuda_blockwise_fp8_linear_matches_the_cpu_twin(m, n, k):
    if not torch.cuda.is_available():
        pytest.skip(no_gpu("needs an NVIDIA GPU"))
    reason = cuda_unsupported_reason((n, k), (128, 128), torch.device("cuda"))
    if reason is not None:
        pytest.skip(reason)
    x, weight, scale = operands(m, n, k, "cuda")
    got = blockwise_fp8_linear_cuda(x, weight, scale, out_dtype=torch.float32).cpu()
    want = blockwise_fp8_linear_reference(x.cpu(), weight.cpu(), scale.cpu(), out_dtype=torch.float32)
    # the same FP8 products; only the order of the float32 accumulation differs
    torch.testing.assert_close(got, want, atol=1e-3 * want.abs().max().item(), rtol=1e-3)
