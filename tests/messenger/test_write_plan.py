"""The write entries of `layer_writes`, applied byte for byte between real KV pool layouts, rebuild
every destination rank's pages exactly; they touch no byte outside the granted pages; their number
is what the planner tells the decode side to expect."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from disaggsdk.kv.layout import KVPageFormat, KVPool  # noqa: E402
from disaggsdk.messenger.write_plan import PoolGeometry, layer_writes, pages_ready  # noqa: E402
from disaggsdk.plan import expected_writes, make_plan, num_prefill_pages  # noqa: E402
from tests.plan.helpers import make_spec, tiny_arch  # noqa: E402

NUM_LAYERS, PAGE_SIZE, HEAD_DIM, KV_HEADS, LATENT = 2, 4, 3, 4, 6
# (attention, prefill tp, decode tp, decode dp): identical, reconstruct, split, replicate, MLA tp, MLA dp
CASES = [("gqa", 2, 2, 1), ("gqa", 4, 1, 1), ("gqa", 1, 4, 1), ("gqa", 8, 2, 1), ("gqa", 2, 8, 1),
         ("mla", 2, 2, 1), ("mla", 4, 1, 2)]


def pool_of(inst, tp_rank: int, num_pages: int, layout: str, attention: str) -> KVPool:
    heads = inst.ranks[tp_rank].kv_heads
    local = 0 if attention == "mla" else heads[1] - heads[0]
    fmt = KVPageFormat(NUM_LAYERS, num_pages, PAGE_SIZE, layout, attention, local,
                       HEAD_DIM if attention == "gqa" else 0, LATENT if attention == "mla" else 0, "float32")
    return KVPool(fmt)


def fill(pool: KVPool, inst, tp_rank: int, truth, page_ids, attention: str) -> None:
    """Write the token data of ``truth`` ([layers, tokens, heads, 2, head_dim] or [layers, tokens, latent])."""
    num_tokens = truth.shape[1]
    for layer in range(NUM_LAYERS):
        for t in range(num_tokens):
            page, off = page_ids[t // PAGE_SIZE], t % PAGE_SIZE
            if attention == "mla":
                pool.latent(layer)[page, off] = truth[layer, t]
            else:
                start, stop = inst.ranks[tp_rank].kv_heads
                k, v = pool.k_v_token_major(layer)
                k[page, off] = truth[layer, t, start:stop, 0]
                v[page, off] = truth[layer, t, start:stop, 1]


def read(pool: KVPool, inst, tp_rank: int, layer: int, t: int, page_ids, attention: str):
    page, off = page_ids[t // PAGE_SIZE], t % PAGE_SIZE
    if attention == "mla":
        return pool.latent(layer)[page, off]
    k, v = pool.k_v_token_major(layer)
    return torch.stack([k[page, off], v[page, off]], dim=1)


@pytest.mark.parametrize("layout", ["HND", "NHD"])
@pytest.mark.parametrize("attention,p_tp,d_tp,d_dp", CASES, ids=[f"{c[0]}-p{c[1]}-d{c[2]}x{c[3]}" for c in CASES])
def test_writes_rebuild_every_destination_page(attention, p_tp, d_tp, d_dp, layout):
    arch = tiny_arch(attention, KV_HEADS, HEAD_DIM, NUM_LAYERS, latent=LATENT)
    spec = make_spec(p_tp, d_tp, d_dp=d_dp, layout=layout, page_size=PAGE_SIZE, dtype="float32")
    plan = make_plan(spec, arch)
    route = plan.routes[0]
    src_inst, dst_inst = plan.instance(route.prefill), plan.instance(route.decode)
    num_tokens = 11  # prompt length: 10 tokens move, in 3 pages, the last one partly filled
    moved = num_tokens - 1
    gen = torch.Generator().manual_seed(p_tp * 100 + d_tp)
    shape = (NUM_LAYERS, moved, LATENT) if attention == "mla" else (NUM_LAYERS, moved, KV_HEADS, 2, HEAD_DIM)
    truth = torch.randn(shape, generator=gen)
    src_pages, dst_pages = [5, 1, 6], [2, 7, 0]
    assert len(src_pages) == num_prefill_pages(num_tokens, PAGE_SIZE)
    for request_id in ("r1", "r2", "r3"):  # MLA with dp rotates the writer per request
        transfers = route.transfers_for(request_id)
        src = [pool_of(src_inst, r, 8, layout, attention) for r in range(p_tp)]
        dst = [pool_of(dst_inst, r, 9, layout, attention) for r in range(d_tp)]
        for r in range(p_tp):
            fill(src[r], src_inst, r, truth, src_pages, attention)
        src_geo = PoolGeometry(NUM_LAYERS, 8, src[0].fmt.page_bytes)
        dst_geo = PoolGeometry(NUM_LAYERS, 9, dst[0].fmt.page_bytes)
        num_entries = 0
        for layer in range(NUM_LAYERS):
            for w in layer_writes(transfers, layout, layer, src_geo, dst_geo, src_pages, dst_pages):
                num_entries += len(w)
                for so, do, n in zip(w.src_offsets, w.dst_offsets, w.lengths):
                    dst[w.dst_tp_rank].buffer[do:do + n] = src[w.src_tp_rank].buffer[so:so + n]
        assert num_entries == expected_writes(route, num_tokens, layout).kv_writes
        for r in range(d_tp):
            for layer in range(NUM_LAYERS):
                for t in range(moved):
                    want = truth[layer, t]
                    if attention == "gqa":
                        start, stop = dst_inst.ranks[r].kv_heads
                        want = want[start:stop]
                    assert torch.equal(read(dst[r], dst_inst, r, layer, t, dst_pages, attention), want)
            untouched = [p for p in range(9) if p not in dst_pages]
            assert not dst[r].pages[:, untouched].any(), "a write landed outside the granted pages"


def test_layer_writes_refuse_pages_outside_the_pool():
    arch = tiny_arch("gqa", KV_HEADS, HEAD_DIM, NUM_LAYERS)
    route = make_plan(make_spec(1, 1, page_size=PAGE_SIZE, dtype="float32"), arch).routes[0]
    geo = PoolGeometry(NUM_LAYERS, 4, 96)
    with pytest.raises(ValueError, match="outside"):
        layer_writes(route.transfers, "HND", 0, geo, geo, [0, 1], [3, 4])
    with pytest.raises(ValueError, match="source pages"):
        layer_writes(route.transfers, "HND", 0, geo, geo, [0, 1], [3])
    with pytest.raises(ValueError, match="not"):
        PoolGeometry.of_region(NUM_LAYERS, 96, 96 * NUM_LAYERS * 4 + 1)
    assert PoolGeometry.of_region(NUM_LAYERS, 96, 96 * NUM_LAYERS * 4).num_pages == 4


@pytest.mark.parametrize("start,n,last,ready", [(0, 3, False, 0), (0, 4, False, 1), (0, 5, False, 1),
                                                 (0, 5, True, 2), (4, 8, False, 3), (12, 1, True, 4)])
def test_pages_ready_sends_a_partial_page_only_at_the_prompt_end(start, n, last, ready):
    assert pages_ready(start, n, PAGE_SIZE, last) == ready


@settings(max_examples=40, deadline=None)
@given(case=st.sampled_from(CASES), layout=st.sampled_from(["HND", "NHD"]), num_tokens=st.integers(2, 40),
       data=st.data())
def test_a_decode_prefix_hit_expects_exactly_the_writes_of_the_pages_that_move(case, layout, num_tokens, data):
    attention, p_tp, d_tp, d_dp = case
    arch = tiny_arch(attention, KV_HEADS, HEAD_DIM, NUM_LAYERS, latent=LATENT)
    plan = make_plan(make_spec(p_tp, d_tp, d_dp=d_dp, layout=layout, page_size=PAGE_SIZE, dtype="float32"), arch)
    route = plan.routes[0]
    need = num_prefill_pages(num_tokens, PAGE_SIZE)
    cached = data.draw(st.integers(0, need))
    geo = PoolGeometry(NUM_LAYERS, 16, 64)
    moving = list(range(cached, need))
    entries = sum(len(w) for layer in range(NUM_LAYERS)
                  for w in layer_writes(route.transfers_for("r"), layout, layer, geo, geo, moving, moving))
    expected = expected_writes(route, num_tokens, layout, num_cached_pages=cached)
    assert expected.kv_writes == entries and expected.num_pages == need - cached
    assert expected.context_writes == (1 if need - cached else 0)
    with pytest.raises(ValueError):
        expected_writes(route, num_tokens, layout, num_cached_pages=need + 1)
