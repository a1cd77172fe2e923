"""The reference paged backend against dense causal attention, and batched against one-by-one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.attention import create_backend  # noqa: E402
from disaggsdk.engine.batch_builder import BatchItem, build_forward_batch  # noqa: E402
from disaggsdk.engine.kv_cache import KVCache  # noqa: E402
from disaggsdk.engine.modeling.base import KVGeometry  # noqa: E402

PAGE_SIZE = 4
# (tokens already cached, new tokens): a fresh prefill, decodes, a later prefill chunk
REQUESTS = [(0, 6), (3, 1), (8, 1), (5, 11), (11, 1), (9, 3)]  # (9, 3): a short chunk over earlier KV


def pages_for(rng: torch.Generator, num_pages: int, lens: list[int]) -> list[list[int]]:
    perm = torch.randperm(num_pages, generator=rng).tolist()  # scattered, out-of-order pages
    out = []
    for n in lens:
        need = -(-n // PAGE_SIZE)
        out.append(perm[:need])
        perm = perm[need:]
    return out


def dense(q, k, v, q_pos, scale):
    """Naive causal attention of one request: q [n, Hq, D] at positions q_pos, k/v [kv, Hkv, *]."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    mask = torch.arange(k.shape[0])[None, :] <= torch.tensor(q_pos)[:, None]
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def run_step(cache, backend_name, reqs, pages, qs, ks, vs, mla=False, rank=0, gather_budget_bytes=None):
    """Write each request's cached prefix, then run its new tokens through the backend."""
    items = []
    for (cached, new), page_ids in zip(reqs, pages):
        items.append(BatchItem(token_ids=[0] * new, start_pos=cached, page_ids=page_ids))
    # prefix KV goes in through a first step of the backend itself (it is the writer)
    backend = create_backend(backend_name, cache)
    if gather_budget_bytes is not None:
        backend.gather_budget_bytes = gather_budget_bytes
    pre = [(i, c) for i, (c, _) in enumerate(reqs) if c > 0]
    if pre:
        batch = build_forward_batch([BatchItem([0] * c, 0, pages[i]) for i, c in pre], PAGE_SIZE)
        backend.plan(batch)
        sl = [slice(0, c) for _, c in pre]
        if mla:
            backend.run_mla(0, *(torch.cat([x[i][s] for (i, _), s in zip(pre, sl)]) for x in qs),
                            *(torch.cat([x[i][s] for (i, _), s in zip(pre, sl)]) for x in (ks, vs)), 0.3)
        else:
            backend.run(0, torch.cat([qs[i][s] for (i, _), s in zip(pre, sl)]),
                        torch.cat([ks[i][s] for (i, _), s in zip(pre, sl)]),
                        torch.cat([vs[i][s] for (i, _), s in zip(pre, sl)]), 0.3)
    batch = build_forward_batch(items, PAGE_SIZE)
    backend.plan(batch)
    new = [slice(c, c + n) for c, n in reqs]
    if mla:
        out = backend.run_mla(0, *(torch.cat([x[i][s] for i, s in enumerate(new)]) for x in qs),
                              *(torch.cat([x[i][s] for i, s in enumerate(new)]) for x in (ks, vs)), 0.3)
    else:
        out = backend.run(0, torch.cat([q[s] for q, s in zip(qs, new)]),
                          torch.cat([k[s] for k, s in zip(ks, new)]),
                          torch.cat([v[s] for v, s in zip(vs, new)]), 0.3)
    run_step.last_backend = backend
    return out


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_decodes_split_into_cache_sized_calls_match_one_call(layout):
    """A gather budget smaller than one request puts every decode in its own call: same output."""
    rng = torch.Generator().manual_seed(2)
    hq, hkv, d = 4, 2, 8
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=hkv, head_dim=d)
    reqs = [(3, 1), (8, 1), (13, 1), (1, 1)]
    lens = [c + n for c, n in reqs]
    qs, ks, vs = ([torch.randn(n, h, d, generator=rng) for n in lens] for h in (hq, hkv, hkv))
    pages = pages_for(rng, 32, lens)
    outs = {}
    for budget in (1, 1 << 30):
        outs[budget] = run_step(KVCache(geo, 32, PAGE_SIZE, layout), "torch_ref", reqs, pages, qs, ks, vs,
                                gather_budget_bytes=budget)
        assert len(run_step.last_backend._groups) == (len(reqs) if budget == 1 else 1)
    torch.testing.assert_close(outs[1], outs[1 << 30], rtol=1e-6, atol=1e-6)
    for i, (cached, _) in enumerate(reqs):
        torch.testing.assert_close(outs[1][i : i + 1], dense(qs[i][cached:], ks[i], vs[i], [cached], 0.3),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_gqa_matches_dense_and_single_requests(layout):
    rng = torch.Generator().manual_seed(0)
    hq, hkv, d = 4, 2, 8
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=hkv, head_dim=d)
    lens = [c + n for c, n in REQUESTS]
    qs = [torch.randn(n, hq, d, generator=rng) for n in lens]
    ks = [torch.randn(n, hkv, d, generator=rng) for n in lens]
    vs = [torch.randn(n, hkv, d, generator=rng) for n in lens]
    pages = pages_for(rng, 32, lens)
    out = run_step(KVCache(geo, 32, PAGE_SIZE, layout), "torch_ref", REQUESTS, pages, qs, ks, vs)
    # the fresh prefill (0, 6) took the causal fast path, the later chunk (5, 11) the masked one
    assert sorted(g.fresh for g in run_step.last_backend._groups if g.rows.shape[1] > 1) == [False, True]
    rows = 0
    for i, (cached, new) in enumerate(REQUESTS):
        ref = dense(qs[i][cached:], ks[i], vs[i], list(range(cached, cached + new)), 0.3)
        torch.testing.assert_close(out[rows : rows + new], ref, rtol=1e-5, atol=1e-5)
        single = run_step(KVCache(geo, 32, PAGE_SIZE, layout), "torch_ref", [REQUESTS[i]], [pages[i]],
                          [qs[i]], [ks[i]], [vs[i]])
        torch.testing.assert_close(out[rows : rows + new], single, rtol=1e-6, atol=1e-6)
        rows += new


def test_layouts_store_the_same_tokens():
    rng = torch.Generator().manual_seed(1)
    geo = KVGeometry(attention="gqa", num_layers=1, num_kv_heads_local=2, head_dim=8)
    lens = [c + n for c, n in REQUESTS]
    qs = [torch.randn(n, 2, 8, generator=rng) for n in lens]
    ks = [torch.randn(n, 2, 8, generator=rng) for n in lens]
    pages = pages_for(rng, 32, lens)
    caches = {lay: KVCache(geo, 32, PAGE_SIZE, lay) for lay in ("HND", "NHD")}
    for cache in caches.values():
        run_step(cache, "torch_ref", REQUESTS, pages, qs, ks, ks)
    k_hnd, _ = caches["HND"].k_v(0)
    k_nhd, _ = caches["NHD"].k_v(0)
    assert torch.equal(k_hnd.transpose(1, 2), k_nhd)
    assert not torch.equal(caches["HND"].buffer, caches["NHD"].buffer)


def test_mla_matches_dense_absorbed_attention():
    rng = torch.Generator().manual_seed(2)
    h, rank, rope = 4, 12, 4
    geo = KVGeometry(attention="mla", num_layers=1, num_kv_heads_local=1, head_dim=16,
                     latent_dim=rank + rope, kv_lora_rank=rank, qk_rope_head_dim=rope)
    lens = [c + n for c, n in REQUESTS]
    q_lat = [torch.randn(n, h, rank, generator=rng) for n in lens]
    q_rope = [torch.randn(n, h, rope, generator=rng) for n in lens]
    kv_lat = [torch.randn(n, rank, generator=rng) for n in lens]
    k_rope = [torch.randn(n, rope, generator=rng) for n in lens]
    pages = pages_for(rng, 32, lens)
    out = run_step(KVCache(geo, 32, PAGE_SIZE), "torch_ref", REQUESTS, pages, (q_lat, q_rope),
                   kv_lat, k_rope, mla=True)
    assert any(g.fresh for g in run_step.last_backend._groups)
    rows = 0
    for i, (cached, new) in enumerate(REQUESTS):
        q = torch.cat([q_lat[i], q_rope[i]], -1)[cached:]
        k = torch.cat([kv_lat[i], k_rope[i]], -1)[:, None]
        ref = dense(q, k, kv_lat[i][:, None], list(range(cached, cached + new)), 0.3)
        torch.testing.assert_close(out[rows : rows + new], ref, rtol=1e-5, atol=1e-5)
        rows += new
