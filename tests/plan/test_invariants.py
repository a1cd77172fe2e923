"""Property tests of the routes: every destination byte written exactly once, with the right data.

Byte meaning is modelled here independently of the planner: each byte of a page is labelled with
what it holds (global KV head, K or V, token, dim, byte of the element), decoded from the layouts
in docs/plan-json.md. A write is correct when the source label equals the label the destination
byte must hold.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disaggsdk.plan import REPLICATED, expected_writes, make_plan, num_prefill_pages
from tests.plan.helpers import make_spec, tiny_arch

ELEM_BYTES = {"fp8": 1, "bfloat16": 2}


def byte_label(offset, heads, layout, page_size, head_dim, elem, latent):
    """What byte ``offset`` of a page holds on a rank storing ``heads`` ("replicated" = MLA)."""
    index, byte = divmod(offset, elem)
    if heads == REPLICATED:
        token, dim = divmod(index, latent)
        return ("latent", token, dim, byte)
    local = heads[1] - heads[0]
    if layout == "HND":  # [heads][K|V][page_size][head_dim]
        head, rest = divmod(index, 2 * page_size * head_dim)
        kv, rest = divmod(rest, page_size * head_dim)
        token, dim = divmod(rest, head_dim)
    else:  # NHD: [page_size][heads][K|V][head_dim]
        token, rest = divmod(index, local * 2 * head_dim)
        head, rest = divmod(rest, 2 * head_dim)
        kv, dim = divmod(rest, head_dim)
    return (heads[0] + head, kv, token, dim, byte)


@st.composite
def deployments(draw):
    attention = draw(st.sampled_from(["gqa", "gqa", "mla"]))
    heads = draw(st.integers(1, 16)) if attention == "gqa" else 1
    valid_tp = [t for t in range(1, 17) if attention == "mla" or heads % t == 0 or t % heads == 0]
    return dict(
        attention=attention,
        heads=heads,
        p_tp=draw(st.sampled_from(valid_tp)),
        d_tp=draw(st.sampled_from(valid_tp)),
        d_dp=draw(st.sampled_from([1, 1, 2])),
        layout=draw(st.sampled_from(["HND", "NHD"])),
        page_size=draw(st.sampled_from([1, 2, 4, 8])),
        dtype=draw(st.sampled_from(sorted(ELEM_BYTES))),
        head_dim=draw(st.integers(1, 3)),
        num_layers=draw(st.integers(1, 2)),
        num_tokens=draw(st.integers(0, 20)),
        seed=draw(st.integers(0, 3)),
        request_id=draw(st.integers(0, 10**6)),
    )


@settings(max_examples=250, deadline=None)
@given(deployments())
def test_every_destination_byte_written_once_with_the_right_data(d):
    arch = tiny_arch(d["attention"], d["heads"], d["head_dim"], d["num_layers"])
    spec = make_spec(
        d["p_tp"], d["d_tp"], d_dp=d["d_dp"], layout=d["layout"], page_size=d["page_size"],
        dtype=d["dtype"], gpus_per_node=32, nics_per_node=4, seed=d["seed"],
    )
    plan = make_plan(spec, arch)
    (route,) = plan.routes
    prefill, decode = plan.instances
    elem = ELEM_BYTES[d["dtype"]]
    latent = arch.kv_lora_rank + arch.qk_rope_head_dim
    pages = num_prefill_pages(d["num_tokens"], d["page_size"])
    src_page = route.src_shape.page_bytes
    dst_page = route.dst_shape.page_bytes
    layout = d["layout"]

    def label(offset, heads):
        return byte_label(offset, heads, layout, d["page_size"], d["head_dim"], elem, latent)

    transfers = route.transfers_for(d["request_id"])
    expected = expected_writes(route, d["num_tokens"], layout)
    for dst_tp in range(decode.tp):
        dst_heads = decode.rank_of(0, dst_tp).kv_heads
        pool_bytes = d["num_layers"] * pages * dst_page
        # one page of one layer, byte by byte: each byte once, and the byte it must be
        written = {}
        kv_writes = 0
        intervals = []
        for t in (t for t in transfers if t.dst_tp_rank == dst_tp):
            src_heads = prefill.rank_of(0, t.src_tp_rank).kv_heads
            for src_off, dst_off, length in t.page_runs(layout).runs():
                assert 0 <= src_off and src_off + length <= src_page
                assert 0 <= dst_off and dst_off + length <= dst_page
                for i in range(length):
                    assert dst_off + i not in written, "byte written twice"
                    written[dst_off + i] = label(src_off + i, src_heads)
                # every page of every layer of the pool: [layers][pages][page_bytes]
                for layer in range(d["num_layers"]):
                    for page in range(pages):
                        start = (layer * pages + page) * dst_page + dst_off
                        intervals.append((start, start + length))
                        kv_writes += 1
        assert sorted(written) == list(range(dst_page)), "page not fully written"
        for offset, got in written.items():
            assert got == label(offset, dst_heads), f"byte {offset} holds the wrong data"
        # the writes tile the request's part of the pool: no gap, no overlap, nothing beyond
        intervals.sort()
        ends = [0] + [b for _, b in intervals]
        assert [a for a, _ in intervals] == ends[:-1]
        assert ends[-1] == pool_bytes
        context = 1 if pages and dst_tp == 0 else 0
        rank = expected.ranks[dst_tp]
        assert (rank.kv_writes, rank.context_writes) == (kv_writes, context)
        assert rank.total == kv_writes + context


@settings(max_examples=150, deadline=None)
@given(deployments())
def test_every_prefill_device_writes_where_possible(d):
    arch = tiny_arch(d["attention"], d["heads"], d["head_dim"], d["num_layers"])
    spec = make_spec(d["p_tp"], d["d_tp"], gpus_per_node=16, seed=d["seed"])
    (route,) = make_plan(spec, arch).routes
    sources = {t.src_tp_rank for t in route.transfers}
    if route.dst.num_replica_sets >= route.src.num_replica_sets:
        assert not route.source_per_request
        assert sources == set(range(d["p_tp"]))
    else:  # fewer copies wanted than P holds: the writing set rotates per request
        assert route.source_per_request
        used = {
            t.src_tp_rank for rid in range(64 * d["p_tp"]) for t in route.transfers_for(rid)
        }
        assert used == set(range(d["p_tp"]))
        assert route.transfers_for(d["request_id"]) == route.transfers_for(d["request_id"])
