"""The CPU backend's native decode kernel against the torch reference (the oracle) and dense attention."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine import attention  # noqa: E402
from disaggsdk.engine.attention import cpu_backend, default_backend  # noqa: E402
from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch  # noqa: E402
from disaggsdk.engine.kv_cache import KVCache  # noqa: E402
from disaggsdk.engine.modeling.base import KVGeometry  # noqa: E402
from tests.engine.attention.test_torch_ref import PAGE_SIZE, REQUESTS, dense, pages_for, run_step  # noqa: E402

pytestmark = pytest.mark.skipif(not cpu_backend.kernel_available(), reason="CPU attention kernel not built")

DECODES = [(3, 1), (8, 1), (13, 1), (1, 1), (30, 1)]


def gqa_inputs(seed: int, reqs, hq=4, hkv=2, d=8):
    rng = torch.Generator().manual_seed(seed)
    lens = [c + n for c, n in reqs]
    qs, ks, vs = ([torch.randn(n, h, d, generator=rng) for n in lens] for h in (hq, hkv, hkv))
    return qs, ks, vs, pages_for(rng, 64, lens)


@pytest.mark.parametrize("head_dim", [8, 32], ids=["scalar-path", "vector-path"])
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("reqs", [DECODES, REQUESTS], ids=["decode-only", "mixed"])
def test_kernel_matches_reference_backend(layout, kv_dtype, reqs, head_dim):
    """Decode-only steps (planned from tensors) and mixed steps (decodes and short chunks over
    earlier KV beside prefill chunks):
    the CPU backend's output equals the torch reference's on the same cache contents, on the
    kernel's vector path (dims that are multiples of 16) and its scalar one."""
    qs, ks, vs, pages = gqa_inputs(0, reqs, d=head_dim)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=head_dim)
    outs = {name: run_step(KVCache(geo, 64, PAGE_SIZE, layout, kv_dtype), name, reqs, pages, qs, ks, vs)
            for name in ("torch_ref", "cpu")}
    backend = run_step.last_backend
    assert isinstance(backend, cpu_backend.CpuBackend) and backend._decode is not None  # the kernel ran
    # one-token requests, and each query of a short chunk over earlier KV (a speculative step's)
    short = attention.torch_ref.SHORT_CHUNK_TOKENS
    assert len(backend._decode[0]) == sum(n for c, n in reqs if n == 1 or (n <= short and c > 0))
    torch.testing.assert_close(outs["cpu"], outs["torch_ref"], rtol=1e-5, atol=1e-5)
    if kv_dtype == "float32":
        rows = 0
        for i, (cached, new) in enumerate(reqs):
            ref = dense(qs[i][cached:], ks[i], vs[i], list(range(cached, cached + new)), 0.3)
            torch.testing.assert_close(outs["cpu"][rows : rows + new], ref, rtol=1e-5, atol=1e-5)
            rows += new


@pytest.mark.parametrize("rank,rope", [(12, 4), (32, 16)], ids=["scalar-path", "vector-path"])
def test_kernel_mla_matches_reference_backend(rank, rope):
    rng = torch.Generator().manual_seed(3)
    h = 4
    geo = KVGeometry(attention="mla", num_layers=1, num_kv_heads_local=1, head_dim=16,
                     latent_dim=rank + rope, kv_lora_rank=rank, qk_rope_head_dim=rope)
    lens = [c + n for c, n in DECODES]
    q = ([torch.randn(n, h, rank, generator=rng) for n in lens], [torch.randn(n, h, rope, generator=rng) for n in lens])
    kv_lat = [torch.randn(n, rank, generator=rng) for n in lens]
    k_rope = [torch.randn(n, rope, generator=rng) for n in lens]
    pages = pages_for(rng, 64, lens)
    outs = {name: run_step(KVCache(geo, 64, PAGE_SIZE), name, DECODES, pages, q, kv_lat, k_rope, mla=True)
            for name in ("torch_ref", "cpu")}
    assert run_step.last_backend._decode is not None
    torch.testing.assert_close(outs["cpu"], outs["torch_ref"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [1, 2, 3, 4, 8, 12, 16])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_kernel_head_blocks_and_full_key_blocks_match_dense_attention(group, kv_dtype):
    """The vector path's specialised value passes (query heads per block 1, 2, 4, 8, and the
    general count: 3, and 12 = 8 + 4) and its 16-key score blocks, whole (pages of 32) and cut
    short by a page's or a request's end, against dense attention over the same keys."""
    rng = torch.Generator().manual_seed(group)
    hkv, d, dv, page_size, num_pages = 2, 32, 48, 32, 24
    kv_lens = [1, 15, 16, 17, 33, 64, 100]
    # keys and values as views of one buffer (the kernel takes one set of strides for both), with
    # a value dim other than the key dim, as MLA's
    pool = torch.randn(num_pages, page_size, hkv, d + dv, generator=rng).to(kv_dtype)
    keys, values = pool[..., :d], pool[..., d:]
    order = torch.randperm(num_pages, generator=rng)
    per_request = [-(-n // page_size) for n in kv_lens]
    indptr = torch.tensor([0, *torch.tensor(per_request).cumsum(0).tolist()], dtype=torch.int64)
    page_indices = order[: int(indptr[-1])].to(torch.int64).contiguous()
    q = torch.randn(len(kv_lens), group * hkv, d, generator=rng)
    out = torch.zeros(len(kv_lens), group * hkv, dv)
    cpu_backend.paged_decode(q, torch.arange(len(kv_lens)), keys, values, page_indices, indptr,
                             torch.tensor(kv_lens), 0.2, out)
    for b, n in enumerate(kv_lens):
        pages = page_indices[indptr[b] : indptr[b + 1]]
        k = keys[pages].reshape(-1, hkv, d)[:n].float()
        v = values[pages].reshape(-1, hkv, dv)[:n].float()
        ref = dense(q[b : b + 1], k, v, [n - 1], 0.2)
        torch.testing.assert_close(out[b : b + 1], ref, rtol=1e-5, atol=1e-5)


def test_the_decode_kernel_shares_torchs_thread_pool_and_gives_the_same_result_on_any_thread_count():
    """The kernel links the libgomp torch ships (one per process), so `torch.set_num_threads` sets
    its threads too; a call big enough to share out (16 requests x 2 kv heads) gives bit-identical
    output on one thread and on two (each (request, kv head) pair runs whole on one thread)."""
    rng = torch.Generator().manual_seed(7)
    hkv, group, d, page_size = 2, 4, 32, 16
    kv_lens = [150 + 7 * b for b in range(16)]
    per_request = [-(-n // page_size) for n in kv_lens]
    num_pages = sum(per_request)
    pool = torch.randn(num_pages, page_size, hkv, 2 * d, generator=rng)
    keys, values = pool[..., :d], pool[..., d:]
    indptr = torch.tensor([0, *torch.tensor(per_request).cumsum(0).tolist()], dtype=torch.int64)
    page_indices = torch.randperm(num_pages, generator=rng).to(torch.int64)
    q = torch.randn(len(kv_lens), group * hkv, d, generator=rng)
    before = torch.get_num_threads()
    outs = {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert cpu_backend._cpu_kernels.lib.paged_decode_threads() == threads
            outs[threads] = torch.zeros(len(kv_lens), group * hkv, d)
            cpu_backend.paged_decode(q, torch.arange(len(kv_lens)), keys, values, page_indices, indptr,
                                     torch.tensor(kv_lens), 0.2, outs[threads])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[1], outs[2]) and outs[1].abs().sum() > 0


def test_bfloat16_queries_are_attended_in_float32():
    """A bfloat16 model: queries go through the kernel in float32, the output comes back bfloat16."""
    qs, ks, vs, pages = gqa_inputs(1, DECODES)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=8)
    bf = [[x.bfloat16() for x in xs] for xs in (qs, ks, vs)]
    outs = {name: run_step(KVCache(geo, 64, PAGE_SIZE, "HND", "bfloat16"), name, DECODES, pages, *bf)
            for name in ("torch_ref", "cpu")}
    assert outs["cpu"].dtype == torch.bfloat16
    torch.testing.assert_close(outs["cpu"].float(), outs["torch_ref"].float(), rtol=2e-2, atol=2e-2)


def test_float16_cache_falls_back_to_the_reference_decode():
    qs, ks, vs, pages = gqa_inputs(2, DECODES)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=8)
    out = run_step(KVCache(geo, 64, PAGE_SIZE, "HND", "float16"), "cpu", DECODES, pages, qs, ks, vs)
    backend = run_step.last_backend
    assert backend._decode is None and backend._groups  # the torch path ran the decodes
    ref = run_step(KVCache(geo, 64, PAGE_SIZE, "HND", "float16"), "torch_ref", DECODES, pages, qs, ks, vs)
    torch.testing.assert_close(out, ref)


def test_default_backend_on_cpu_is_the_kernel_and_falls_back_without_it(monkeypatch):
    assert default_backend("cpu") == "cpu"
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(attention.importlib.util, "find_spec",
                        lambda name, *a: None if name == attention.CPU_KERNELS_MODULE else real_find_spec(name, *a))
    assert default_backend("cpu") == "torch_ref"


def test_decode_only_plan_builds_no_python_groups():
    """The decode instance's steps: one kernel call per layer, planned without per-request lists."""
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=8)
    backend = attention.create_backend("cpu", KVCache(geo, 64, PAGE_SIZE))
    batch = build_forward_batch([BatchItem([0], 5, [1, 2]), BatchItem([0], 2, [3])], PAGE_SIZE)
    backend.plan(batch)
    rows, page_indices, page_indptr, kv_lens = backend._decode
    assert backend._groups == []
    assert rows.tolist() == [0, 1] and page_indices.tolist() == [1, 2, 3]
    assert page_indptr.tolist() == [0, 2, 3] and kv_lens.tolist() == [6, 3]


def _spy_causal_prefill(monkeypatch) -> list[bool]:
    """Record what each call of the causal prefill kernel returned (True: it computed the group)."""
    results: list[bool] = []
    real = cpu_backend.causal_prefill

    def spy(*args):
        results.append(real(*args))
        return results[-1]

    monkeypatch.setattr(cpu_backend, "causal_prefill", spy)
    return results


@pytest.mark.parametrize("head_dim", [16, 48], ids=["16-wide", "32-wide-then-16"])
@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_fresh_prompts_go_through_the_causal_kernel(monkeypatch, layout, head_dim):
    """Fresh prompts of two lengths (two fresh groups) beside decodes and a later chunk: equal to
    the reference and to dense attention, with the kernel computing both fresh groups (its value
    pass runs 32 dims at a time, then 16)."""
    reqs = [(0, 37), (0, 5), (0, 37), (9, 1), (20, 6)]
    qs, ks, vs, pages = gqa_inputs(4, reqs, hq=8, hkv=2, d=head_dim)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=head_dim)
    ref = run_step(KVCache(geo, 64, PAGE_SIZE, layout), "torch_ref", reqs, pages, qs, ks, vs)
    ran = _spy_causal_prefill(monkeypatch)
    out = run_step(KVCache(geo, 64, PAGE_SIZE, layout), "cpu", reqs, pages, qs, ks, vs)
    # the prefix step's fresh prompts of 9 and 20 tokens, then the 37-token pair and the 5-token
    # prompt; (20, 6) is a later chunk (the masked reference path)
    assert ran == [True, True, True, True]
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert_dense(out, reqs, qs, ks, vs)


def test_causal_kernel_declines_head_dims_it_does_not_tile(monkeypatch):
    """8-dim values are not a multiple of the kernel's 16-float vectors: the reference path runs."""
    reqs = [(0, 9), (0, 9)]
    qs, ks, vs, pages = gqa_inputs(5, reqs)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=8)
    ref = run_step(KVCache(geo, 64, PAGE_SIZE), "torch_ref", reqs, pages, qs, ks, vs)
    ran = _spy_causal_prefill(monkeypatch)
    out = run_step(KVCache(geo, 64, PAGE_SIZE), "cpu", reqs, pages, qs, ks, vs)
    assert ran == [False]
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_chunks_over_earlier_kv_go_through_the_prefix_kernel(monkeypatch, layout):
    """Prefill chunks over earlier KV (a prefix-cache hit: 48 cached tokens and 24 new; a later
    chunk of 9 over 20; two of one length in one group) beside a fresh prompt and a decode: the
    prefix kernel computes them, equal to the reference and to dense attention."""
    reqs = [(48, 24), (20, 9), (0, 12), (31, 1), (30, 24)]
    qs, ks, vs, pages = gqa_inputs(6, reqs, hq=8, hkv=2, d=32)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=32)
    ref = run_step(KVCache(geo, 64, PAGE_SIZE, layout), "torch_ref", reqs, pages, qs, ks, vs)
    calls = []
    real = cpu_backend.prefix_prefill
    monkeypatch.setattr(cpu_backend, "prefix_prefill",
                        lambda q, *a: calls.append((q.shape[0], a[2])) or real(q, *a))
    out = run_step(KVCache(geo, 64, PAGE_SIZE, layout), "cpu", reqs, pages, qs, ks, vs)
    assert sorted(calls) == [(9, 20), (24, 30), (24, 48)]  # (queries, cached keys) of each chunk
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert_dense(out, reqs, qs, ks, vs)


def test_the_prefill_kernels_share_query_tiles_among_torchs_threads_with_the_same_result():
    """A 300-token prompt (10 query tiles, the last one partial, x 2 kv heads) and a 70-token chunk
    over 230 cached keys: each (kv head, query tile) pair runs whole on one thread, so one thread
    and two give bit-identical output, and both equal dense causal attention."""
    rng = torch.Generator().manual_seed(11)
    hq, hkv, d = 8, 2, 32
    q, k, v = (torch.randn(300, h, d, generator=rng) for h in (hq, hkv, hkv))
    before = torch.get_num_threads()
    fresh, chunk = {}, {}
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            fresh[threads] = torch.zeros(300, hq, d)
            assert cpu_backend.causal_prefill(q, k, v, torch.tensor([0]), torch.tensor([300]), 0.3, fresh[threads])
            chunk[threads] = torch.zeros(70, hq, d)
            assert cpu_backend.prefix_prefill(q[230:], k, v, 230, 0.3, chunk[threads])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(fresh[1], fresh[2]) and torch.equal(chunk[1], chunk[2])
    torch.testing.assert_close(fresh[1], dense(q, k, v, list(range(300)), 0.3), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunk[1], fresh[1][230:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("hq", "hkv", "d"), [(2, 2, 32), (6, 2, 48), (8, 1, 16), (5, 1, 32)],
                         ids=["one-head-a-kv-head", "three-then-48-dims", "eight", "five"])
def test_the_prefill_kernels_take_any_group_of_query_heads(hq, hkv, d):
    """The kernels take rows of (token, query head) pairs eight at a time: with 1, 3, 5 or 8 query
    heads a kv head a pass spans tokens unevenly, and the last pass is partial (padding rows); a
    prompt of 170 tokens crosses key tiles and the diagonal at every offset. Equal to dense causal
    attention, fresh and as a chunk of 41 over 129 cached keys."""
    rng = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(170, h, d, generator=rng) for h in (hq, hkv, hkv))
    fresh = torch.zeros(170, hq, d)
    assert cpu_backend.causal_prefill(q, k, v, torch.tensor([0]), torch.tensor([170]), 0.2, fresh)
    torch.testing.assert_close(fresh, dense(q, k, v, list(range(170)), 0.2), rtol=1e-5, atol=1e-5)
    chunk = torch.zeros(41, hq, d)
    assert cpu_backend.prefix_prefill(q[129:], k, v, 129, 0.2, chunk)
    torch.testing.assert_close(chunk, fresh[129:], rtol=1e-5, atol=1e-5)


def assert_dense(out, reqs, qs, ks, vs) -> None:
    """Each request's output rows equal dense causal attention over its whole K and V."""
    rows = 0
    for i, (cached, new) in enumerate(reqs):
        torch.testing.assert_close(out[rows : rows + new],
                                   dense(qs[i][cached:], ks[i], vs[i], list(range(cached, cached + new)), 0.3),
                                   rtol=1e-5, atol=1e-5)
        rows += new


def test_default_backend_on_cuda_is_flashinfer_for_16_bit_steps_only(monkeypatch):
    """FlashInfer takes 16-bit queries and 16-bit or fp8 KV: a float32 model or cache on a GPU runs the reference."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "flashinfer" else real(name))
    assert default_backend("cuda", "bfloat16", "bfloat16") == "flashinfer"
    assert default_backend("cuda:1", "float16", "float8_e4m3fn") == "flashinfer"
    assert default_backend("cuda", "float32", "float32") == "torch_ref"
    assert default_backend("cuda", "bfloat16", "float32") == "torch_ref"
