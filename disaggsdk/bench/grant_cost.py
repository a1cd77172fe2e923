"""What the KV data plane's guards cost per request: per-grant keys and page digests.

    python -m disaggsdk.bench.grant_cost [--provider tcp] [--layers 4] [--page-kib 32] [--pages 64] [--runs 3] [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence


def measure(provider: str, num_layers: int, page_bytes: int, num_pages: int, num_runs: int,
            repeat: int) -> dict[str, float | int | str]:
    """Time opening + revoking one grant and digesting its pages; returns the JSON fields."""
    from disaggsdk.kv.pools.shared_memory import SharedRegion
    from disaggsdk.messenger.grant_keys import open_grant
    from disaggsdk.messenger.page_digest import PageDigest, add_granted_pages, attempt_key
    from disaggsdk.messenger.write_plan import PoolGeometry
    from disaggsdk.transfer import TransferEngine

    pool_pages = num_pages * 2
    geometry = PoolGeometry(num_layers, pool_pages, page_bytes)
    # num_runs runs of consecutive pages, a free page between two runs
    per_run = -(-num_pages // num_runs)
    page_ids = [r * (per_run + 1) + i for r in range(num_runs) for i in range(per_run)][:num_pages]
    with TransferEngine(provider) as engine:
        pool = SharedRegion.create(geometry.pool_bytes, "grant-cost")
        context = bytearray(4096)
        try:
            pool_mr = engine.register(pool.buffer, remote_write=False)
            context_mr = engine.register(context, remote_write=False)
            grant_us, digest_us = [], []
            registrations = 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                keys = open_grant(engine, [pool_mr], geometry, page_ids, context_mr, 0, 4096)
                registrations = len(keys.registrations)
                keys.revoke(engine)
                t1 = time.perf_counter()
                digest = PageDigest(attempt_key(b"k" * 32, "r", 1, 1))
                add_granted_pages(digest, [pool_mr.view()], geometry, page_ids)
                digest.digest()
                t2 = time.perf_counter()
                grant_us.append((t1 - t0) * 1e6)
                digest_us.append((t2 - t1) * 1e6)
            engine.deregister(context_mr)
            engine.deregister(pool_mr)
        finally:
            pool.close()
    kv_bytes = num_layers * len(page_ids) * page_bytes
    digest_median = statistics.median(digest_us)
    return {
        "provider": provider, "num_layers": num_layers, "page_bytes": page_bytes, "num_pages": len(page_ids),
        "registrations_per_grant": registrations, "kv_bytes_per_grant": kv_bytes,
        "grant_open_revoke_us": round(statistics.median(grant_us), 1),
        "us_per_registration": round(statistics.median(grant_us) / registrations, 2),
        "digest_us": round(digest_median, 1), "digest_gb_per_s": round(kv_bytes / digest_median / 1e3, 2),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m disaggsdk.bench.grant_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--provider", default="tcp", help="libfabric provider: tcp or shm")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--page-kib", type=float, default=32.0, help="bytes of one page of one layer, in KiB")
    parser.add_argument("--pages", type=int, default=64, help="pages granted (a 1,024-token prompt of 16-token pages)")
    parser.add_argument("--runs", type=int, default=3, help="runs of consecutive pages they fall in")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.provider, args.layers, int(args.page_kib * 1024), args.pages, args.runs,
                             args.repeat)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
