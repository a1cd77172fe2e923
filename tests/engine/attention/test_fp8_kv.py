"""An fp8 KV cache (`kv.dtype: fp8`) in the reference backend and the native CPU kernel: pages hold
float8_e4m3fn, attention reads them times the layer's static scales."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.attention import cpu_backend  # noqa: E402
from disaggsdk.engine.kv_cache import KVCache  # noqa: E402
from disaggsdk.engine.kv_scales import KVScales  # noqa: E402
from disaggsdk.engine.modeling.base import KVGeometry  # noqa: E402
from tests.declared_skips import no_gpu  # noqa: E402
from tests.engine.attention.test_torch_ref import PAGE_SIZE, REQUESTS, dense, pages_for, run_step  # noqa: E402

FP8 = torch.float8_e4m3fn
DECODES = [(3, 1), (8, 1), (13, 1), (1, 1), (30, 1)]
# scales other than 1.0, and different for K and V: a backend that skipped or swapped them fails
SCALES = KVScales(k=(0.25,), v=(2.0,))
needs_kernel = pytest.mark.skipif(not cpu_backend.kernel_available(), reason="CPU attention kernel not built")


def gqa_inputs(seed: int, reqs, hq=4, hkv=2, d=8):
    rng = torch.Generator().manual_seed(seed)
    lens = [c + n for c, n in reqs]
    qs, ks, vs = ([torch.randn(n, h, d, generator=rng) for n in lens] for h in (hq, hkv, hkv))
    return qs, ks, vs, pages_for(rng, 64, lens)


def as_stored(x: torch.Tensor, scale: float) -> torch.Tensor:
    """What attention over an fp8 page reads back: x / scale rounded to e4m3, times scale
    (written here independently of engine.kv_scales)."""
    return (x / scale).clamp(-448, 448).to(FP8).float() * scale


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_reference_attends_over_the_rounded_kv_times_its_scales(layout):
    """Prefill chunks, decodes and short chunks over fp8 pages equal dense attention over the K and V
    each rounded through e4m3 with its own scale; the pages hold fp8 (one byte an element)."""
    qs, ks, vs, pages = gqa_inputs(0, REQUESTS)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=8)
    cache = KVCache(geo, 64, PAGE_SIZE, layout, "fp8", scales=SCALES)
    assert cache.dtype == FP8 and cache.fmt.elem_bytes == 1
    out = run_step(cache, "torch_ref", REQUESTS, pages, qs, ks, vs)
    rows = 0
    for i, (cached, new) in enumerate(REQUESTS):
        k, v = as_stored(ks[i], 0.25), as_stored(vs[i], 2.0)
        ref = dense(qs[i][cached:], k, v, list(range(cached, cached + new)), 0.3)
        torch.testing.assert_close(out[rows : rows + new], ref, rtol=1e-5, atol=1e-5)
        rows += new
    # the stored bytes are K / k_scale: the first request's first token, read back raw
    k_pages, _ = cache.k_v_token_major(0)
    stored = k_pages[pages[0][0], 0].float()
    torch.testing.assert_close(stored, (ks[0][0] / 0.25).to(FP8).float())


def test_writes_saturate_instead_of_overflowing():
    """Values past e4m3's range (448 x scale) are stored as +-448, never as NaN."""
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=1, head_dim=4)
    cache = KVCache(geo, 4, PAGE_SIZE, "HND", "fp8")
    k = torch.tensor([[[1e4, -1e4, 3.0, 0.0]]])
    run_step(cache, "torch_ref", [(0, 1)], [[2]], [torch.zeros(1, 1, 4)], [k], [k])
    k_pages, v_pages = cache.k_v_token_major(0)
    assert k_pages[2, 0, 0].float().tolist() == [448.0, -448.0, 3.0, 0.0]


@needs_kernel
@pytest.mark.parametrize("head_dim", [8, 32], ids=["scalar-path", "vector-path"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("reqs", [DECODES, REQUESTS], ids=["decode-only", "mixed"])
def test_cpu_kernel_reads_fp8_pages_as_the_reference(layout, reqs, head_dim):
    """The CPU backend (decode kernel with its scaled e4m3 table; prefill kernels over dequantized
    copies) equals the torch reference on the same fp8 pages and scales."""
    qs, ks, vs, pages = gqa_inputs(1, reqs, d=head_dim)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=head_dim)
    outs = {name: run_step(KVCache(geo, 64, PAGE_SIZE, layout, "fp8", scales=SCALES), name, reqs, pages, qs, ks, vs)
            for name in ("torch_ref", "cpu")}
    backend = run_step.last_backend
    assert isinstance(backend, cpu_backend.CpuBackend) and backend._decode is not None  # the kernel ran
    torch.testing.assert_close(outs["cpu"], outs["torch_ref"], rtol=1e-5, atol=1e-5)


@needs_kernel
@pytest.mark.parametrize("rank,rope", [(12, 4), (32, 16)], ids=["scalar-path", "vector-path"])
@pytest.mark.parametrize("reqs", [DECODES, REQUESTS], ids=["decode-only", "mixed"])
def test_cpu_kernel_reads_an_fp8_mla_latent_as_the_reference(rank, rope, reqs):
    """MLA: one scale for the latent and its rope key; the kernel and the reference agree, and both
    equal dense attention over the rounded latent."""
    rng = torch.Generator().manual_seed(5)
    h = 4
    geo = KVGeometry(attention="mla", num_layers=1, num_kv_heads_local=1, head_dim=16,
                     latent_dim=rank + rope, kv_lora_rank=rank, qk_rope_head_dim=rope)
    lens = [c + n for c, n in reqs]
    q = ([torch.randn(n, h, rank, generator=rng) for n in lens], [torch.randn(n, h, rope, generator=rng) for n in lens])
    kv_lat = [torch.randn(n, rank, generator=rng) for n in lens]
    k_rope = [torch.randn(n, rope, generator=rng) for n in lens]
    pages = pages_for(rng, 64, lens)
    scales = KVScales(k=(0.5,), v=(0.5,))
    outs = {name: run_step(KVCache(geo, 64, PAGE_SIZE, dtype="fp8", scales=scales), name, reqs, pages, q, kv_lat,
                           k_rope, mla=True)
            for name in ("torch_ref", "cpu")}
    torch.testing.assert_close(outs["cpu"], outs["torch_ref"], rtol=1e-5, atol=1e-5)
    rows = 0
    for i, (cached, new) in enumerate(reqs):
        keys = as_stored(torch.cat([kv_lat[i], k_rope[i]], -1), 0.5).unsqueeze(1)
        qi = torch.cat([q[0][i], q[1][i]], -1)[cached:]
        ref = dense(qi, keys, keys[..., :rank], list(range(cached, cached + new)), 0.3)
        torch.testing.assert_close(outs["cpu"][rows : rows + new], ref, rtol=1e-5, atol=1e-5)
        rows += new


@needs_kernel
def test_decode_kernel_decodes_every_e4m3_byte():
    """Every finite e4m3 byte (subnormals, both signs, +-448; the two NaN bytes replaced by zeros)
    as keys and values of one request: the kernel's output equals dense attention over torch's own
    e4m3 -> float32 conversion times each scale."""
    finite = torch.tensor([{0x7F: 0x00, 0xFF: 0x80}.get(b, b) for b in range(256)], dtype=torch.uint8)
    d, page_size = 16, 16
    keys_bytes = finite.view(FP8).reshape(-1, 1, d)  # [16 tokens, 1 head, 16]
    n = keys_bytes.shape[0]
    pool = torch.zeros(1, page_size, 1, 2 * d, dtype=FP8)
    pool[0, :n, :, :d] = keys_bytes
    pool[0, :n, :, d:] = keys_bytes
    keys, values = pool[..., :d], pool[..., d:]
    q = torch.full((1, 1, d), 1e-3)  # small: the softmax stays away from one-hot
    out = torch.zeros(1, 1, d)
    cpu_backend.paged_decode(q, torch.arange(1), keys, values, torch.tensor([0]), torch.tensor([0, 1]),
                             torch.tensor([n]), 1.0, out, kv_scales=(0.5, 3.0))
    k = keys_bytes.float() * 0.5
    v = keys_bytes.float() * 3.0
    ref = dense(q, k, v, [n - 1], 1.0)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


# on a GPU, flashinfer missing is a failure (the backend says what to install), not a skip
HAVE_GPU = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_GPU, reason=no_gpu("needs CUDA (and flashinfer-python): FlashInfer's fp8 KV runs on GPUs only"))
@pytest.mark.parametrize("layout", ["HND", "NHD", "MLA"])
@pytest.mark.parametrize("requests", [[(0, 37), (5, 1), (40, 1), (17, 9)], [(3, 1), (64, 1), (100, 1)]],
                         ids=["mixed", "decode"])
def test_flashinfer_reads_fp8_pages_as_the_reference(layout, requests):
    """FlashInfer planned with kv_data_type float8_e4m3fn and given each layer's k_scale / v_scale
    (MLA: ckv_scale and kpe_scale, SM90 only) against the torch reference on the same fp8 pages."""
    lens = [c + n for c, n in requests]
    pages = pages_for(torch.Generator().manual_seed(0), 64, lens)
    dev, dt = "cuda", torch.bfloat16
    outs = {}
    for name in ("torch_ref", "flashinfer"):
        rng = torch.Generator().manual_seed(1)  # same inputs for both backends

        def rand(*shape, rng=rng):
            return torch.randn(*shape, generator=rng).to(dev, dt)

        if layout == "MLA":
            geo = KVGeometry(attention="mla", num_layers=1, num_kv_heads_local=1, head_dim=192, latent_dim=576,
                             kv_lora_rank=512, qk_rope_head_dim=64)
            qs = ([rand(n, 16, 512) * 0.1 for n in lens], [rand(n, 16, 64) * 0.1 for n in lens])
            ks, vs = [rand(n, 512) for n in lens], [rand(n, 64) for n in lens]
            cache = KVCache(geo, 64, 4, dtype="fp8", device=dev, scales=KVScales((0.5,), (0.5,)))
            outs[name] = run_step(cache, name, requests, pages, qs, ks, vs, mla=True)
        else:
            geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=64)
            qs = [rand(n, 8, 64) for n in lens]
            ks, vs = [rand(n, 2, 64) for n in lens], [rand(n, 2, 64) for n in lens]
            cache = KVCache(geo, 64, 4, layout, dtype="fp8", device=dev, scales=SCALES)
            outs[name] = run_step(cache, name, requests, pages, qs, ks, vs)
    torch.testing.assert_close(outs["flashinfer"].float(), outs["torch_ref"].float(), rtol=3e-2, atol=3e-2)
