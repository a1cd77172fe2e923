"""Fixtures: a target engine in the test process and sender engines in real processes."""

from __future__ import annotations

import multiprocessing
import socket

import pytest

from tests.transfer._peers import SRC_BYTES, sender_main

# "shm-direct": shm with the target's pool registered as shared memory, so same-host senders
# map it and copy with memcpy (disaggsdk/transfer/same_host.py); only the immediates go via shm
PROVIDERS = ["shm", "shm-direct", "tcp"]
DST_BYTES = 1 << 20
NUM_SENDERS = 2


class Sender:
    """The test's side of one sender process."""

    def __init__(self, ctx, provider: str):
        from disaggsdk.kv.pools.fd_passing import recv_region

        provider = provider.removesuffix("-direct")
        self.conn, child_conn = ctx.Pipe()
        self.sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.process = ctx.Process(target=sender_main, args=(provider, child_conn, child_sock),
                                   daemon=True)
        self.process.start()
        child_conn.close()
        child_sock.close()
        self.sock.settimeout(60)
        self.src = recv_region(self.sock)  # the sender's source bytes, mapped here
        assert self.conn.poll(60), "sender did not start"
        _, self.address = self.conn.recv()

    def call(self, *cmd, timeout_s: float = 60):
        self.conn.send(cmd)
        assert self.conn.poll(timeout_s), f"sender did not answer {cmd[0]!r}"
        return self.conn.recv()

    def stop(self) -> None:
        try:
            if self.process.is_alive():
                self.conn.send(("quit",))
            self.process.join(10)
        except (OSError, EOFError):
            pass
        finally:
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
            self.conn.close()
            self.sock.close()
            self.src.close()


class Target:
    """The receiving side: an engine and a memfd pool in the test process, plus senders."""

    def __init__(self, provider: str):
        from disaggsdk.kv.pools.shared_memory import SharedRegion
        from disaggsdk.transfer import TransferEngine

        self.direct = provider.endswith("-direct")
        self.provider = provider.removesuffix("-direct")  # the libfabric provider
        self.engine = TransferEngine(self.provider)
        self.pool = SharedRegion.create(DST_BYTES, "test-dst")
        self.region = self.engine.register(self.pool.buffer, shared_fd=self.pool.fd if self.direct else None)
        self.senders: list[Sender] = []
        self.peers = []

    def add_sender(self, sender: Sender) -> None:
        reply = sender.call("connect", self.engine.address, self.region.descriptor.to_bytes())
        assert reply == ("ok",), reply
        self.senders.append(sender)
        self.peers.append(self.engine.add_peer(sender.address))

    def close(self) -> None:
        for s in self.senders:
            s.stop()
        self.engine.deregister(self.region)
        self.engine.close()
        self.region = None
        self.pool.close()


@pytest.fixture(scope="module", params=PROVIDERS)
def target(request):
    """A target engine with NUM_SENDERS sender processes, per provider; all torn down after."""
    ctx = multiprocessing.get_context("spawn")
    t = Target(request.param)
    try:
        for _ in range(NUM_SENDERS):
            t.add_sender(Sender(ctx, request.param))
        yield t
    finally:
        t.close()


assert SRC_BYTES == DST_BYTES  # page maps in the tests index both regions alike
