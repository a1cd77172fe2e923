"""KV pool views: byte layout of HND / NHD / MLA pages, strided K and V, external buffers."""

from __future__ import annotations

import mmap

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.kv.layout import KVLayoutError, KVPageFormat, KVPool, kv_dtype_name  # noqa: E402


def gqa(layout: str, **kw) -> KVPageFormat:
    args = dict(num_layers=2, num_pages=3, page_size=4, layout=layout, num_kv_heads_local=2, head_dim=5)
    args.update(kw)
    return KVPageFormat(**args)


def test_hnd_head_slice_is_one_contiguous_run_with_k_then_v():
    pool = KVPool(gqa("HND"))
    k, v = pool.k_v(1)
    assert k.shape == (3, 2, 4, 5) and v.shape == (3, 2, 4, 5)
    k[2, 1].fill_(1.0)
    v[2, 1].fill_(2.0)
    page = pool.pages[1, 2]  # [page_elems]
    run = 2 * 4 * 5  # K|V of one head
    assert torch.all(page[:run] == 0)
    assert torch.all(page[run : run + 20] == 1.0) and torch.all(page[run + 20 :] == 2.0)
    # the other layer is untouched
    assert torch.all(pool.pages[0] == 0)


def test_nhd_interleaves_heads_per_token():
    pool = KVPool(gqa("NHD"))
    k, v = pool.k_v(0)
    assert k.shape == (3, 4, 2, 5)
    k[0, 1, 1].fill_(7.0)  # token 1, head 1, K
    page = pool.pages[0, 0].view(4, 2, 2, 5)
    assert torch.all(page[1, 1, 0] == 7.0)
    assert int((page != 0).sum()) == 5


def test_token_major_view_agrees_across_layouts():
    for layout in ("HND", "NHD"):
        pool = KVPool(gqa(layout))
        k_tm, v_tm = pool.k_v_token_major(0)
        assert k_tm.shape == (3, 4, 2, 5)
        k_tm[1, 3, 0] = torch.arange(5.0)
        k, _ = pool.k_v(0)
        got = k[1, 0, 3] if layout == "HND" else k[1, 3, 0]
        assert torch.equal(got, torch.arange(5.0))


def test_mla_page_is_token_major_latent():
    fmt = KVPageFormat(num_layers=1, num_pages=2, page_size=4, attention="mla", latent_dim=6)
    pool = KVPool(fmt)
    assert fmt.page_bytes == 4 * 6 * 4
    pool.latent(0)[1, 2] = torch.arange(6.0)
    assert torch.equal(pool.pages[0, 1][12:18], torch.arange(6.0))
    with pytest.raises(KVLayoutError):
        pool.k_v(0)


def test_bfloat16_pool_size_and_views():
    fmt = gqa("HND", dtype_name="bfloat16")
    assert fmt.pool_bytes == 2 * 3 * (2 * 2 * 4 * 5) * 2
    k, _ = KVPool(fmt).k_v(0)
    assert k.dtype == torch.bfloat16


def test_fp8_pool_holds_a_byte_an_element_and_the_spec_name_maps_to_torchs():
    fmt = gqa("NHD", dtype_name=kv_dtype_name("fp8"))
    assert fmt.dtype_name == "float8_e4m3fn" and fmt.elem_bytes == 1
    assert fmt.pool_bytes == 2 * 3 * (2 * 2 * 4 * 5)
    k, v = KVPool(fmt).k_v(1)
    assert k.dtype == v.dtype == torch.float8_e4m3fn
    assert kv_dtype_name("float8_e4m3fn") == "float8_e4m3fn" and kv_dtype_name("bfloat16") == "bfloat16"


def test_an_unknown_kv_dtype_is_refused_with_the_names_to_use():
    with pytest.raises(KVLayoutError, match="kv.dtype to one of"):
        kv_dtype_name("int8")
    with pytest.raises(KVLayoutError, match="unknown KV dtype 'fp8'"):
        gqa("HND", dtype_name="fp8")  # the format takes torch's names; kv_dtype_name maps the spec's


def test_external_buffer_is_used_without_copy():
    fmt = gqa("HND")
    with mmap.mmap(-1, fmt.pool_bytes) as mem:
        pool = KVPool(fmt, buffer=mem)
        pool.k_v(0)[0][0, 0, 0, 0] = 3.5
        assert torch.frombuffer(mem, dtype=torch.float32)[0].item() == 3.5
        del pool
    tensor = torch.zeros(fmt.pool_bytes, dtype=torch.uint8)
    pool = KVPool(fmt, buffer=tensor)
    assert pool.buffer.data_ptr() == tensor.data_ptr()


def test_wrong_buffer_size_and_bad_geometry_are_user_errors():
    fmt = gqa("HND")
    with pytest.raises(KVLayoutError, match="pool_bytes"):
        KVPool(fmt, buffer=bytearray(fmt.pool_bytes - 1))
    with pytest.raises(KVLayoutError, match="layout"):
        gqa("HDN")
    with pytest.raises(KVLayoutError):
        KVPageFormat(num_layers=1, num_pages=1, page_size=1, attention="mla")
