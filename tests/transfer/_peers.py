"""A sender peer that runs in its own process (multiprocessing, spawn) for the transfer tests.

Protocol over a multiprocessing Pipe (test -> sender), replies are tuples:
  ("hello")          sender -> test, right after start: (address bytes, src size)
  ("connect", addr, desc_bytes)                      -> ("ok",)
  ("write", src_offs, dst_offs, lengths, imms)       -> ("ok", stats) or ("error", message)
  ("echo",)  wait for one control message, send it back -> ("ok",) or ("error", message)
  ("quit",)
Its source region is a memfd whose fd goes to the test over a socketpair, so the test reads the
exact bytes that were sent.
"""

from __future__ import annotations

import os
import socket
import traceback

SRC_BYTES = 1 << 20


def sender_main(provider: str, conn, fd_sock: socket.socket) -> None:
    """Entry point of a sender process."""
    from disaggsdk.kv.pools.fd_passing import send_region
    from disaggsdk.kv.pools.shared_memory import SharedRegion
    from disaggsdk.transfer import RegionDescriptor, TransferEngine, WriteBatch

    engine = TransferEngine(provider)
    src = SharedRegion.create(SRC_BYTES, "test-src")
    src.buffer[:] = os.urandom(SRC_BYTES)
    region = engine.register(src.buffer)
    send_region(fd_sock, src)
    conn.send(("hello", engine.address))
    peer = dst = None
    try:
        while True:
            cmd = conn.recv()
            try:
                if cmd[0] == "quit":
                    return
                if cmd[0] == "connect":
                    peer = engine.add_peer(cmd[1])
                    dst = RegionDescriptor.from_bytes(cmd[2])
                    conn.send(("ok",))
                elif cmd[0] == "write":
                    batch = WriteBatch.of(region, dst, *cmd[1:])
                    engine.submit(peer, batch).result(timeout=30)
                    conn.send(("ok", engine.stats()))
                elif cmd[0] == "echo":
                    engine.send(peer, engine.recv(timeout_s=30)).result(timeout=30)
                    conn.send(("ok",))
            except Exception as exc:  # noqa: BLE001 - any error goes back to the test, which decides
                conn.send(("error", f"{type(exc).__name__}: {exc}",
                           traceback.format_exc(limit=3)))
    finally:
        engine.deregister(region)
        engine.close()
        del region
        src.close()
