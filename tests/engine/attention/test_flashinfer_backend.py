"""FlashInfer backend against the torch reference (GPU only), and its error without CUDA."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.attention import AttentionBackendError, create_backend  # noqa: E402
from disaggsdk.engine.kv_cache import KVCache  # noqa: E402
from disaggsdk.engine.modeling.base import KVGeometry  # noqa: E402
from tests.declared_skips import no_gpu  # noqa: E402

# on a GPU, flashinfer missing is a failure (the backend says what to install), not a skip
HAVE_GPU = torch.cuda.is_available()
GQA = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=64)
MLA = KVGeometry(attention="mla", num_layers=1, num_kv_heads_local=1, head_dim=192, latent_dim=576,
                 kv_lora_rank=512, qk_rope_head_dim=64)


def test_cpu_cache_or_missing_package_is_a_clear_error():
    with pytest.raises(AttentionBackendError, match="torch_ref"):
        create_backend("flashinfer", KVCache(GQA, 4, 16, "HND"))
    with pytest.raises(AttentionBackendError, match="unknown attention backend"):
        create_backend("flash", KVCache(GQA, 4, 16, "HND"))


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason=no_gpu("needs CUDA (and flashinfer-python)"))
@pytest.mark.parametrize("layout", ["HND", "NHD", "MLA"])
@pytest.mark.parametrize("requests", [[(0, 37), (5, 1), (40, 1), (17, 9)], [(3, 1), (64, 1), (100, 1)]],
                         ids=["mixed", "decode"])
def test_flashinfer_matches_torch_ref(layout, requests):
    from test_torch_ref import pages_for, run_step  # the reference harness, run on both backends

    rng = torch.Generator().manual_seed(0)
    lens = [c + n for c, n in requests]
    pages = pages_for(rng, 64, lens)
    dev, dt = "cuda", torch.bfloat16

    def rand(*shape):
        return torch.randn(*shape, generator=rng).to(dev, dt)

    outs = {}
    for name in ("torch_ref", "flashinfer"):
        rng = torch.Generator().manual_seed(1)  # same inputs for both backends
        if layout == "MLA":
            qs = ([rand(n, 16, 512) * 0.1 for n in lens], [rand(n, 16, 64) * 0.1 for n in lens])
            ks, vs = [rand(n, 512) for n in lens], [rand(n, 64) for n in lens]
            cache = KVCache(MLA, 64, 4, dtype="bfloat16", device=dev)
            outs[name] = run_step(cache, name, requests, pages, qs, ks, vs, mla=True)
        else:
            qs = [rand(n, 8, 64) for n in lens]
            ks, vs = [rand(n, 2, 64) for n in lens], [rand(n, 2, 64) for n in lens]
            cache = KVCache(GQA, 64, 4, layout, dtype="bfloat16", device=dev)
            outs[name] = run_step(cache, name, requests, pages, qs, ks, vs)
    torch.testing.assert_close(outs["flashinfer"].float(), outs["torch_ref"].float(), rtol=2e-2, atol=2e-2)
