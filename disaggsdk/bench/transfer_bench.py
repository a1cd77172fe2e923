"""Transfer benchmark: paged writes between two processes against a plain memory copy.

Measurement only (the CLI `disaggsdk transfer-bench` renders). The initiator (this process)
writes page batches into a region of a target process; a cell's clock stops when the target's
immediate counter says every entry has landed, so GB/s counts delivered bytes. The reference
copies the same runs of the same page map between two buffers of this process.
"""

from __future__ import annotations

import multiprocessing
import random
import statistics
import time
from concurrent.futures import Future
from functools import partial
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import attrs

from disaggsdk.transfer.errors import TransferError

if TYPE_CHECKING:
    from disaggsdk.transfer.descriptors import MemoryRegion, Peer, RegionDescriptor
    from disaggsdk.transfer.engine import TransferEngine

MAX_BATCH_BYTES = 4 << 20  # pages per batch: up to this many bytes
MAX_BATCHES_IN_FLIGHT = 4


@attrs.frozen
class BenchCell:
    """One measured (write size, page map) combination."""

    provider: str
    path: str  # "direct" (same-host memcpy + immediates over the provider) or "fabric"
    page_map: str  # "contiguous" or "random"
    write_bytes: int  # bytes per write entry (one page)
    num_writes: int  # entries submitted (before coalescing)
    num_posted: int  # fi_writedata calls (after coalescing)
    total_bytes: int
    elapsed_s: float
    gb_per_s: float  # delivered bytes / elapsed, 1 GB = 1e9 bytes
    writes_per_s: float
    latency_p50_ms: float  # batch submit -> local completion
    latency_p99_ms: float
    memcpy_gb_per_s: float  # the same runs copied in this process, median of 3 around the transfer
    ratio: float  # gb_per_s / memcpy_gb_per_s


def _target_main(provider: str, region_bytes: int, conn: Connection, direct: bool = True) -> None:
    """The receiving process: one region, an immediate counter per cell."""
    from disaggsdk.kv.pools.shared_memory import SharedRegion
    from disaggsdk.transfer.engine import TransferEngine

    with TransferEngine(provider) as engine, SharedRegion.create(region_bytes, "bench-dst") as dst:
        dst.buffer[:] = bytes(region_bytes)  # fault the pages in before measuring
        region = engine.register(dst.buffer, shared_fd=dst.fd if direct else None)
        conn.send((engine.address, region.descriptor.to_bytes()))
        while True:
            cmd = conn.recv()
            if cmd[0] == "quit":
                break
            _, imm, count = cmd
            landed = engine.expect(imm, count)
            conn.send("ready")
            landed.result(timeout=300)
            conn.send("landed")
        engine.deregister(region)


def page_map(kind: str, num_pages: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """(src_pages, dst_pages): identity for "contiguous", independent shuffles for "random"."""
    if kind == "contiguous":
        return list(range(num_pages)), list(range(num_pages))
    src, dst = list(range(num_pages)), list(range(num_pages))
    rng.shuffle(src)
    rng.shuffle(dst)
    return src, dst


def _runs(src: list[int], dst: list[int], page_bytes: int) -> list[tuple[int, int, int]]:
    """Pages merged where contiguous on both sides: (src_off, dst_off, length) runs."""
    runs: list[list[int]] = []
    for s, d in zip(src, dst):
        if runs and runs[-1][0] + runs[-1][2] == s * page_bytes and \
                runs[-1][1] + runs[-1][2] == d * page_bytes:
            runs[-1][2] += page_bytes
        else:
            runs.append([s * page_bytes, d * page_bytes, page_bytes])
    return [tuple(r) for r in runs]  # type: ignore[misc]


def memcpy_gb_per_s(src: memoryview, dst: memoryview, runs: list[tuple[int, int, int]],
                    total_bytes: int) -> float:
    """Copies the runs repeatedly until total_bytes moved; returns GB/s."""
    moved, start = 0, time.perf_counter()
    while moved < total_bytes:
        for s, d, n in runs:
            dst[d:d + n] = src[s:s + n]
            moved += n
            if moved >= total_bytes:
                break
    return moved / (time.perf_counter() - start) / 1e9


def run_cell(engine: TransferEngine, peer: Peer, src_region: MemoryRegion, dst_desc: RegionDescriptor,
             conn: Connection, provider: str,
             kind: str, page_bytes: int, region_bytes: int, total_bytes: int, imm: int,
             copy_bufs: tuple[memoryview, memoryview], seed: int = 0) -> BenchCell:
    """Measures one cell. The target must be listening on `conn`."""
    from disaggsdk.transfer.descriptors import WriteBatch

    num_pages = region_bytes // page_bytes
    src_pages, dst_pages = page_map(kind, num_pages, random.Random(seed))
    per_batch = max(1, min(num_pages, MAX_BATCH_BYTES // page_bytes))
    batches = [WriteBatch.pages(src_region, dst_desc, src_pages[i:i + per_batch],
                                dst_pages[i:i + per_batch], page_bytes, imm)
               for i in range(0, num_pages, per_batch)]
    num_batches = max(1, total_bytes // (per_batch * page_bytes))
    num_writes = sum(len(batches[b % len(batches)]) for b in range(num_batches))
    moved = num_writes * page_bytes
    runs = _runs(src_pages, dst_pages, page_bytes)
    # the reference brackets the transfer (once before, twice after, median): this machine's
    # memory bandwidth drifts by half from one minute to the next, and a ratio against a copy
    # timed minutes apart measures the drift
    refs = [memcpy_gb_per_s(*copy_bufs, runs, moved)]
    conn.send(("expect", imm, num_writes))
    if conn.recv() != "ready":
        raise TransferError("the benchmark target did not answer")
    before = engine.stats()
    latencies: list[float] = []
    in_flight: list[Future[None]] = []

    def done(fut: Future[None], t0: float) -> None:
        latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    for b in range(num_batches):
        if len(in_flight) >= MAX_BATCHES_IN_FLIGHT:
            in_flight.pop(0).result(timeout=300)
        t0 = time.perf_counter()
        fut = engine.submit(peer, batches[b % len(batches)])
        fut.add_done_callback(partial(done, t0=t0))
        in_flight.append(fut)
    for fut in in_flight:
        fut.result(timeout=300)
    if conn.recv() != "landed":
        raise TransferError("the benchmark target did not confirm delivery")
    elapsed = time.perf_counter() - start
    ref = statistics.median(refs + [memcpy_gb_per_s(*copy_bufs, runs, moved) for _ in range(2)])
    lat = sorted(latencies)
    gbps = moved / elapsed / 1e9
    after = engine.stats()
    path = "direct" if after["writes_direct"] > before["writes_direct"] else "fabric"
    return BenchCell(provider, path, kind, page_bytes, num_writes,
                     after["writes_posted"] - before["writes_posted"], moved, elapsed, gbps,
                     num_writes / elapsed, statistics.median(lat) * 1e3,
                     lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3, ref, gbps / ref)


def run_bench(provider: str, sizes: list[int], page_maps: tuple[str, ...] = ("contiguous", "random"),
              region_bytes: int = 64 << 20, total_bytes: int = 256 << 20,
              repeat: int = 1, direct: bool = True) -> list[BenchCell]:
    """Starts a target process and measures every (size, page map) cell.

    Args:
        direct: let shm writes take the same-host path (the target's region is shared memory,
            mapped here and copied with memcpy; only immediates go through libfabric). False
            measures libfabric's own shm transport.
        repeat: measure each cell this many times and keep the run of median ratio to memcpy
            (noisy machines); memcpy is the median of three copies around each run.

    Raises:
        TransferError: the provider cannot be opened or a transfer fails.
    """
    from disaggsdk.kv.pools.shared_memory import SharedRegion
    from disaggsdk.transfer.descriptors import RegionDescriptor
    from disaggsdk.transfer.engine import TransferEngine

    ctx = multiprocessing.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    target = ctx.Process(target=_target_main, args=(provider, region_bytes, child_conn, direct),
                         daemon=True)
    target.start()
    child_conn.close()
    cells: list[BenchCell] = []
    try:
        with TransferEngine(provider, direct=direct) as engine, \
                SharedRegion.create(region_bytes, "bench-src") as src, \
                SharedRegion.create(region_bytes, "bench-copy") as copy_dst:
            src.buffer[:] = random.Random(1).randbytes(region_bytes)
            copy_dst.buffer[:] = bytes(region_bytes)
            src_region = engine.register(src.buffer)
            if not conn.poll(60):
                raise TransferError("the benchmark target process did not start")
            address, desc = conn.recv()
            peer = engine.add_peer(address)
            dst_desc = RegionDescriptor.from_bytes(desc)
            imm = 0
            for size in sizes:
                for kind in page_maps:
                    runs = []
                    for _ in range(max(1, repeat)):
                        imm += 1
                        runs.append(run_cell(engine, peer, src_region, dst_desc, conn, provider,
                                             kind, size, region_bytes, total_bytes, imm,
                                             (src.buffer, copy_dst.buffer)))
                    cells.append(sorted(runs, key=lambda c: c.ratio)[len(runs) // 2])
            conn.send(("quit",))
            engine.deregister(src_region)
        target.join(30)
    finally:
        if target.is_alive():
            target.kill()
            target.join(5)
        conn.close()
    return cells
