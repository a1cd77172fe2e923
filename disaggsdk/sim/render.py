"""Tables of simulation results (rendering only; the numbers come from the simulator)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def runs_table(result: dict[str, Any]) -> Table:
    """One row per (rate, layout): latency, speed per request and utilisation."""
    table = Table(title=f"simulated on {result['profile']}: {result['spec'].get('name') or result['spec']['model']}")
    for col in ("qps", "layout", "req/s", "TTFT mean ms", "TTFT p99 ms", "TPOT mean ms", "ITL p99 ms",
                "tok/s/req", "busiest"):
        table.add_column(col, justify="right", no_wrap=col in ("layout", "busiest"))
    for run in result["runs"]:
        util = run["utilisation"]
        busiest = max(util, key=util.get)
        table.add_row(
            f"{run['qps']:.2f}", "disagg" if run["mode"] == "disaggregated" else "coloc",
            f"{run['request_throughput']:.2f}", f"{run['mean_ttft_ms']:.0f}",
            f"{run['p99_ttft_ms']:.0f}", f"{run['mean_tpot_ms']:.1f}", f"{run['p99_itl_ms']:.1f}",
            f"{run['mean_tokens_per_s_per_request']:.1f}", f"{util[busiest]:.0%} {busiest}",
        )
    return table
