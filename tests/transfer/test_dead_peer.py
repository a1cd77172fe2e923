"""A peer that dies mid-stream does not stall writes to the others, nor the engine's close."""

from __future__ import annotations

import multiprocessing
import time

import pytest

PAGE = 4096


def _doomed_target(provider: str, conn) -> None:
    from disaggsdk.transfer import TransferEngine

    engine = TransferEngine(provider)
    region = engine.register(bytearray(1 << 20))
    conn.send((engine.address, region.descriptor.to_bytes()))
    assert conn.recv() == "freeze"
    # Stop this endpoint's progress thread at a point where it holds nothing, then wait to be
    # killed: libfabric's shm provider guards each receiver's queue with a spinlock in shared
    # memory, and a process killed while holding it (its progress thread reading the queue)
    # wedges every later writer in fi_writedata for good. That hazard is the provider's; this
    # test is about a peer that is gone and never drains again.
    engine._lib.fab_shutdown(engine._engine)
    time.sleep(0.2)  # the thread sees the stop flag within one nap (<= 200 us) and exits
    conn.send("frozen")
    time.sleep(120)  # killed by the test


@pytest.mark.parametrize("provider", ["shm", "tcp"])
def test_dead_peer_does_not_block_live_peer(provider):
    from disaggsdk.transfer import RegionDescriptor, TransferEngine, TransferError, WriteBatch

    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    doomed = ctx.Process(target=_doomed_target, args=(provider, child_conn), daemon=True)
    doomed.start()
    child_conn.close()
    engine = live = None
    try:
        assert conn.poll(60)
        address, desc = conn.recv()
        engine = TransferEngine(provider)
        live = TransferEngine(provider)
        src = engine.register(bytearray(1 << 20))
        live_region = live.register(bytearray(1 << 20))
        dead_peer = engine.add_peer(address)
        live_peer = engine.add_peer(live.address)
        dead_desc = RegionDescriptor.from_bytes(desc)
        engine.submit(dead_peer, WriteBatch.pages(src, dead_desc, [0], [0], PAGE, 1)).result(30)
        conn.send("freeze")
        assert conn.poll(30) and conn.recv() == "frozen"
        doomed.kill()
        doomed.join(10)
        # many separate writes: enough to fill the dead peer's queue (shm then says EAGAIN)
        pages = list(range(0, 256, 2))
        stuck = [engine.submit(dead_peer, WriteBatch.pages(src, dead_desc, pages, pages, PAGE, 1))
                 for _ in range(16)]
        landed = live.expect(2, len(pages))
        engine.submit(live_peer, WriteBatch.pages(src, live_region.descriptor, pages, pages, PAGE,
                                                  2)).result(timeout=30)
        landed.result(timeout=30)
        # what happens to `stuck` is the provider's business: tcp fails them (not connected),
        # shm completes small (inject) writes locally and never completes the others
        for fut in stuck:
            if fut.done() and fut.exception() is not None:
                assert isinstance(fut.exception(), TransferError)
    finally:
        if doomed.is_alive():
            doomed.kill()
            doomed.join(5)
        from disaggsdk.transfer.shm_files import remove_fabric_shm

        remove_fabric_shm(doomed.pid)  # killed before closing its endpoint: its shm file stays
        for eng in (engine, live):
            if eng is not None:
                eng.close()  # must not hang on the writes that never complete
        conn.close()
