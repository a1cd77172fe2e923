"""On a CUDA device, FlashInfer missing is an error that says what to install, never a silent fall
back to the torch reference; the reference runs there only where it is asked for by name."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from disaggsdk.engine.attention import AttentionBackendError, FlashInferMissing, create_backend, default_backend
from disaggsdk.engine.kv_cache import KVCache
from disaggsdk.engine.modeling.base import KVGeometry

GQA = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=64)


@pytest.fixture
def without_flashinfer(monkeypatch):
    """flashinfer neither found nor importable, as on a GPU machine where it was never installed."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        return None if name.split(".")[0] == "flashinfer" else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # `import flashinfer` raises ImportError


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
@pytest.mark.parametrize("weight_dtype,kv_dtype", [("bfloat16", "bfloat16"), ("float16", "float8_e4m3fn")])
def test_a_16_bit_cuda_engine_without_flashinfer_is_told_what_to_install(without_flashinfer, device, weight_dtype,
                                                                         kv_dtype):
    with pytest.raises(FlashInferMissing) as raised:
        default_backend(device, weight_dtype, kv_dtype)
    message = str(raised.value)
    assert "pip install flashinfer-python" in message and "disaggsdk[gpu]" in message
    assert "attention_backend='torch_ref'" in message  # the explicit way to the reference
    assert isinstance(raised.value, AttentionBackendError)


def test_steps_flashinfer_cannot_run_take_the_reference_without_needing_it(without_flashinfer):
    """A float32 model or cache on a GPU runs the reference by design (FlashInfer has no float32
    kernels): no package is missing there."""
    assert default_backend("cuda", "float32", "float32") == "torch_ref"
    assert default_backend("cuda", "bfloat16", "float32") == "torch_ref"
    assert default_backend("cpu", "bfloat16", "bfloat16") in ("cpu", "torch_ref")


def test_with_flashinfer_installed_the_cuda_default_is_flashinfer():
    assert importlib.util.find_spec("flashinfer") is not None  # the gpu extra is part of the install
    assert default_backend("cuda", "bfloat16", "bfloat16") == "flashinfer"


def test_the_backend_itself_says_what_to_install(without_flashinfer):
    with pytest.raises(FlashInferMissing, match="pip install flashinfer-python"):
        create_backend("flashinfer", KVCache(GQA, 4, 16, "HND"))


def test_the_reference_asked_for_by_name_needs_no_flashinfer(without_flashinfer):
    backend = create_backend("torch_ref", KVCache(GQA, 4, 16, "HND"))
    assert type(backend).__name__ == "TorchRefBackend"
