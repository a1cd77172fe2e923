"""A memfd pool allocated by one process (a rank) is mapped and registered by another (the
head), and written there by the transfer engine of a third (the sender)."""

from __future__ import annotations

import multiprocessing
import socket

from disaggsdk.kv.pools.fd_passing import recv_region, send_region

POOL_BYTES = 1 << 20
PAGE = 4096


def rank_main(sock: socket.socket, conn) -> None:
    """Owns the pool: sends its fd, then reports a checksum of what landed when asked."""
    from disaggsdk.kv.pools.shared_memory import SharedRegion

    with SharedRegion.create(POOL_BYTES, "rank-kv-pool") as pool:
        send_region(sock, pool)
        page = conn.recv()
        conn.send(bytes(pool.buffer[page * PAGE:(page + 1) * PAGE]))
        conn.recv()  # wait for the head to be done before unmapping


def test_pool_of_one_process_written_through_another(target):
    from disaggsdk.transfer import TransferEngine

    ctx = multiprocessing.get_context("spawn")
    sock, child_sock = socket.socketpair()
    conn, child_conn = ctx.Pipe()
    rank = ctx.Process(target=rank_main, args=(child_sock, child_conn), daemon=True)
    rank.start()
    child_sock.close()
    child_conn.close()
    engine = pool = region = None
    try:
        sock.settimeout(60)
        pool = recv_region(sock)  # the head maps the rank's pool
        engine = TransferEngine(target.provider)
        region = engine.register(pool.buffer)
        sender = target.senders[0]
        assert sender.call("connect", engine.address, region.descriptor.to_bytes()) == ("ok",)
        done = engine.expect(77, 1)
        assert sender.call("write", [3 * PAGE], [5 * PAGE], PAGE, 77)[0] == "ok"
        done.result(timeout=30)
        conn.send(5)
        assert conn.poll(30)
        assert conn.recv() == bytes(sender.src.buffer[3 * PAGE:4 * PAGE])  # seen by the rank
        conn.send("done")
        rank.join(30)
        assert rank.exitcode == 0
    finally:
        # point the sender back at the module's target for the tests that follow
        target.senders[0].call("connect", target.engine.address,
                               target.region.descriptor.to_bytes())
        if engine is not None:
            if region is not None:
                engine.deregister(region)
            engine.close()
        if pool is not None:
            pool.close()
        if rank.is_alive():
            rank.kill()
            rank.join(5)
        sock.close()
        conn.close()
