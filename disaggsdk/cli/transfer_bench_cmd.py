"""`disaggsdk transfer-bench`: paged-write bandwidth between two processes vs a memory copy."""

from __future__ import annotations

import argparse
import json

import attrs

HELP = "Measure paged RDMA writes between two local processes (shm or tcp) against memcpy."
_UNITS = {"K": 1 << 10, "M": 1 << 20}


def _size(text: str) -> int:
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(text[:-1]) * _UNITS[text[-1]] if text[-1] in _UNITS else int(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the command."""
    parser.add_argument("--provider", default="shm", help="shm, tcp, or a libfabric provider")
    parser.add_argument("--sizes", default="4K,8K,64K,256K,1M,4M",
                        help="write (page) sizes, comma separated (default: %(default)s)")
    parser.add_argument("--maps", default="contiguous,random",
                        help="page maps to measure (default: %(default)s)")
    parser.add_argument("--region-mib", type=int, default=64, help="region size per side")
    parser.add_argument("--total-mib", type=int, default=256, help="bytes written per cell")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per cell; the run of median ratio to memcpy is shown (noisy machines)")
    parser.add_argument("--no-direct", action="store_true",
                        help="shm: send every byte through libfabric's shm provider (its kernel copy), not the "
                             "same-host path that maps the target's shared memory and copies with memcpy")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    """Runs the benchmark and prints the table (or JSON). Returns 0."""
    from rich.table import Table

    from disaggsdk.bench.transfer_bench import run_bench
    from disaggsdk.report.console import make_console

    sizes = [_size(s) for s in args.sizes.split(",")]
    cells = run_bench(args.provider, sizes, tuple(args.maps.split(",")),
                      args.region_mib << 20, args.total_mib << 20, args.repeat, direct=not args.no_direct)
    if args.json:
        print(json.dumps([attrs.asdict(c) for c in cells], indent=2))
        return 0
    path = {"direct": "same-host memcpy, immediates via libfabric", "fabric": "all bytes via libfabric"}
    title = f"paged writes, provider {cells[0].provider if cells else args.provider}"
    if cells:
        title += f" ({', '.join(sorted({path[c.path] for c in cells}))})"
    table = Table(title=title)
    for col in ("write", "map", "writes", "posted", "GB/s", "writes/s", "p50 ms", "p99 ms",
                "memcpy GB/s", "vs memcpy"):
        table.add_column(col, justify="right")
    for c in cells:
        size = f"{c.write_bytes >> 20} MiB" if c.write_bytes >= 1 << 20 else f"{c.write_bytes >> 10} KiB"
        table.add_row(size, c.page_map, str(c.num_writes), str(c.num_posted), f"{c.gb_per_s:.2f}",
                      f"{c.writes_per_s:,.0f}", f"{c.latency_p50_ms:.2f}", f"{c.latency_p99_ms:.2f}",
                      f"{c.memcpy_gb_per_s:.2f}", f"{c.ratio:.2f}x")
    make_console().print(table)
    return 0
