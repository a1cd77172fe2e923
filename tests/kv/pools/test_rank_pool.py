"""Rank pools: allocated on their device, handed to the head over a Unix socket, mapped there."""

from __future__ import annotations

import multiprocessing
import os
import tempfile

import pytest

torch = pytest.importorskip("torch")

from disaggsdk.kv.pools import create_rank_pool, cuda_ordinal  # noqa: E402
from disaggsdk.kv.pools.base import RankPool  # noqa: E402
from disaggsdk.kv.pools.pool_handover import PoolCollector, SharedKVError, send_pool  # noqa: E402
from disaggsdk.kv.pools.shared_memory import SharedRegion  # noqa: E402
from tests.declared_skips import no_gpu  # noqa: E402


def test_cuda_ordinal_names_the_device():
    assert cuda_ordinal("cpu") is None
    assert cuda_ordinal("cuda:3") == 3


def _worker(path: str, rank: int, device: str) -> None:
    pool = create_rank_pool(1 << 16, device, f"test-rank{rank}")
    pool.as_tensor().fill_(rank)
    send_pool(path, rank, pool)
    pool.close()


def _hand_over(device: str, ranks: int) -> dict[int, bytes]:
    """Each worker process fills its pool with its rank and hands it over; what the head reads."""
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "kv.sock")
        collector = PoolCollector(path, ranks)
        procs = [ctx.Process(target=_worker, args=(path, r, device)) for r in range(1, ranks + 1)]
        try:
            for p in procs:
                p.start()
            pools: dict[int, RankPool] = collector.wait(timeout_s=120)
            out = {r: bytes(p.as_tensor()[:64].cpu().numpy()) for r, p in pools.items()}
            assert all((p.cuda_device is None) == (device == "cpu") for p in pools.values())
        finally:
            collector.close()
            for p in procs:
                p.join(60)
                if p.is_alive():
                    p.kill()
        assert not os.path.exists(path)
        return out


def test_memfd_pools_reach_the_head_with_their_bytes():
    assert _hand_over("cpu", 2) == {1: b"\x01" * 64, 2: b"\x02" * 64}


def test_a_host_pool_is_a_shared_region_of_the_asked_size():
    pool = create_rank_pool(4096, "cpu", "test")
    assert isinstance(pool, SharedRegion) and pool.size_bytes == 4096 and pool.cuda_device is None
    pool.close()


def test_a_head_that_is_not_listening_is_a_clear_error(tmp_path):
    pool = create_rank_pool(4096, "cpu", "test")
    with pytest.raises(SharedKVError, match="cannot hand the KV pool"):
        send_pool(str(tmp_path / "nobody.sock"), 1, pool, timeout_s=1)
    pool.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=no_gpu("needs an NVIDIA GPU (and cuda-python)"))
def test_cuda_pools_reach_the_head_as_the_memfd_twin_does():
    """cuMem pools exported by worker processes, imported and mapped by the head: the same bytes as memfds."""
    assert _hand_over("cuda:0", 2) == _hand_over("cpu", 2)
