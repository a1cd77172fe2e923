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


def all_to_all_line(result: dict[str, Any]) -> str | None:
    """The assumptions of the expert all-to-all term, in one sentence (None when no role has ``ep > 1``)."""
    term = result["config"].get("all_to_all")
    if term is None:
        return None
    roles = ", ".join(f"{role} ep {ep}" for role, ep in term["ep"].items())
    return (f"expert all-to-all ({roles}): uniform routing ((ep-1)/ep of a token's expert pairs leave its rank, "
            f"dp groups balanced), {term['activation_dtype']} on the wire, no dedup of a token's pairs to one rank, "
            f"{term['link_gb_per_s']:g} GB/s per direction x {term['link_efficiency']:g} efficiency "
            f"({result['profile']} profile), {term['latency_us_per_call']:g} us per call, "
            f"{term['calls_per_moe_layer']} calls per MoE layer, not overlapped with compute")
