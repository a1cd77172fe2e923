"""A process killed holding a peer's shm queue lock: senders to that peer get stuck, and say so.

libfabric 1.17's shm provider cannot recover from this (native/README.md); what the transport
owes its owner is to make it visible: `health.round_age_s()` grows and `health.posting_to()` names the
peer whose queue is poisoned. `launch/health.py` acts on it.
"""

from __future__ import annotations

import multiprocessing
import os
import time

from tests.fault_injection import build_freeze_shim, freeze_then_kill, preload_env

PAGE = 4096
NUM_PAGES = 32


def _target(conn) -> None:
    from disaggsdk.kv.pools.shared_memory import SharedRegion
    from disaggsdk.transfer import TransferEngine

    engine = TransferEngine("shm")
    pool = SharedRegion.create(NUM_PAGES * PAGE, "poisoned-queue-test")
    region = engine.register(pool.buffer, shared_fd=pool.fd)
    conn.send((engine.address, region.descriptor.to_bytes()))
    while True:  # report what arrives until killed
        try:
            conn.send(("message", engine.recv(timeout_s=0.5)))
        except Exception:  # noqa: BLE001 - nothing within the timeout
            pass


def _doomed_writer(address: bytes, descriptor: bytes, conn) -> None:
    from disaggsdk.transfer import RegionDescriptor, TransferEngine, WriteBatch

    engine = TransferEngine("shm")
    src = engine.register(bytearray(NUM_PAGES * PAGE))
    peer, dst = engine.add_peer(address), RegionDescriptor.from_bytes(descriptor)
    conn.send("writing")
    while True:  # killed by the test while it holds the target's queue lock
        done = [engine.submit(peer, WriteBatch.pages(src, dst, [p], [p], PAGE, 1)) for p in range(16)]
        engine.send(peer, b"x" * 100)
        for future in done:
            future.result(30)


def _late_sender(address: bytes, conn) -> None:
    from disaggsdk.transfer import TransferEngine

    engine = TransferEngine("shm")
    peer = engine.add_peer(address)
    conn.send(("before", engine.health.round_age_s(), engine.health.posting_to()))
    engine.send(peer, b"hello")
    deadline = time.monotonic() + 30
    while engine.health.round_age_s() < 2.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    posting = engine.health.posting_to()
    conn.send(("after", engine.health.round_age_s(), posting.address if posting else None))
    time.sleep(120)  # its thread is stuck for good: closing would wait forever; killed by the test


def test_senders_to_a_poisoned_queue_report_being_stuck(tmp_path):
    from disaggsdk.transfer.shm_files import remove_fabric_shm

    shim = build_freeze_shim(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    procs = []

    def start(target, args, env=None):
        conn, child = ctx.Pipe()
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            p = ctx.Process(target=target, args=(*args, child), daemon=True)
            p.start()
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        child.close()
        procs.append(p)
        return p, conn

    try:
        _, target_conn = start(_target, ())
        assert target_conn.poll(60)
        address, descriptor = target_conn.recv()
        doomed, doomed_conn = start(_doomed_writer, (address, descriptor), preload_env(shim, tmp_path))
        assert doomed_conn.poll(60) and doomed_conn.recv() == "writing"
        time.sleep(0.2)
        freeze_then_kill(doomed.pid, tmp_path)
        doomed.join(10)
        while target_conn.poll(0.5):  # what the doomed writer sent before it froze
            target_conn.recv()

        _, late_conn = start(_late_sender, (address,))
        assert late_conn.poll(60)
        _, age_before, posting_before = late_conn.recv()
        assert age_before < 1.0 and posting_before is None  # a healthy thread goes round at once
        assert late_conn.poll(60)
        _, age_after, posting_address = late_conn.recv()
        assert age_after >= 2.0, "the sender's thread should be stuck posting to the poisoned queue"
        assert posting_address == address  # it names the peer whose queue is poisoned
        assert not target_conn.poll(1.0)  # and the message never arrived
    finally:
        for p in procs:
            p.kill()
            p.join(10)
            remove_fabric_shm(p.pid)
