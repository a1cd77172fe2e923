"""`HostMirror` copies exactly the pages asked, layer by layer out and all layers in."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.kv.pools.host_mirror import HostMirror  # noqa: E402
from tests.declared_skips import no_gpu  # noqa: E402

LAYERS, PAGES, PAGE_BYTES = 3, 8, 16


def pools(ranks: int, fill):
    return [fill(LAYERS * PAGES * PAGE_BYTES) for _ in range(ranks)]


def test_to_host_copies_one_layer_of_the_pages_on_every_rank():
    engine = [torch.randint(0, 255, (LAYERS * PAGES * PAGE_BYTES,), dtype=torch.uint8) for _ in range(2)]
    host = pools(2, lambda n: torch.zeros(n, dtype=torch.uint8))
    mirror = HostMirror(engine, host, LAYERS, PAGES)
    mirror.to_host(1, [5, 2])
    for e, h in zip(engine, host, strict=True):
        e, h = e.view(LAYERS, PAGES, PAGE_BYTES), h.view(LAYERS, PAGES, PAGE_BYTES)
        assert torch.equal(h[1, [5, 2]], e[1, [5, 2]])
        untouched = torch.ones(LAYERS, PAGES, dtype=torch.bool)
        untouched[1, [5, 2]] = False
        assert not h[untouched].any()  # no other layer or page
    assert mirror.bytes_to_host == 2 * PAGE_BYTES * 2


def test_to_device_copies_every_layer_of_the_pages():
    host = [torch.randint(0, 255, (LAYERS * PAGES * PAGE_BYTES,), dtype=torch.uint8)]
    engine = pools(1, lambda n: torch.zeros(n, dtype=torch.uint8))
    mirror = HostMirror(engine, host, LAYERS, PAGES)
    mirror.to_device([7, 0, 3])
    e, h = engine[0].view(LAYERS, PAGES, PAGE_BYTES), host[0].view(LAYERS, PAGES, PAGE_BYTES)
    assert torch.equal(e[:, [7, 0, 3]], h[:, [7, 0, 3]])
    assert not e[:, [1, 2, 4, 5, 6]].any()
    assert mirror.bytes_to_device == 3 * PAGE_BYTES * LAYERS
    mirror.to_device([])  # nothing to copy is a no-op
    assert mirror.bytes_to_device == 3 * PAGE_BYTES * LAYERS


def test_pools_that_do_not_match_are_refused():
    with pytest.raises(ValueError, match="one each per tp rank"):
        HostMirror(pools(2, torch.zeros), pools(1, torch.zeros), LAYERS, PAGES)
    with pytest.raises(ValueError, match="whole pages"):
        HostMirror([torch.zeros(100, dtype=torch.uint8)], [torch.zeros(100, dtype=torch.uint8)], LAYERS, PAGES)
    with pytest.raises(ValueError, match="must hold"):
        HostMirror(pools(1, lambda n: torch.zeros(n, dtype=torch.uint8)), [torch.zeros(48, dtype=torch.uint8)],
                   LAYERS, PAGES)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=no_gpu("needs an NVIDIA GPU"))
def test_cuda_pools_stage_as_the_cpu_twin():
    """The same copies with the engine pools on a GPU give the mirrors the CPU twin gives."""
    src = [torch.randint(0, 255, (LAYERS * PAGES * PAGE_BYTES,), dtype=torch.uint8) for _ in range(2)]
    results = {}
    for device in ("cpu", "cuda"):
        engine = [s.to(device) for s in src]
        host = pools(2, lambda n: torch.zeros(n, dtype=torch.uint8))
        mirror = HostMirror(engine, host, LAYERS, PAGES)
        for layer in range(LAYERS):
            mirror.to_host(layer, [1, 6])
        back = [torch.zeros_like(e) for e in engine]
        HostMirror(back, host, LAYERS, PAGES).to_device([6, 1])
        results[device] = ([h.clone() for h in host], [b.cpu() for b in back])
    for cpu, gpu in zip(results["cpu"], results["cuda"], strict=True):
        assert all(torch.equal(a, b) for a, b in zip(cpu, gpu, strict=True))
