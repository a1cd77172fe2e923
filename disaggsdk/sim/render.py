"""Tables of simulation results (rendering only; the numbers come from the simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from disaggsdk.sim.published import PublishedRow


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


# `disaggsdk simulate --published`: rows as `published_run.FigureResult.to_json` gives them

def published_number(value: float | None, unit: str) -> str:
    """A published or simulated figure as the table prints it ("52,300", "144.7", "2.48"; "-" for none)."""
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.1f}"


def published_claim(row: PublishedRow) -> str:
    """The published side of a row: ``~52,300`` for a number, ``> 90`` / ``< 50`` for a bound."""
    sign = {"about": "~", "above": "> ", "below": "< "}[row["comparison"]]
    value = row["published"]
    return sign + (f"{value:,.0f}" if value == int(value) else f"{value:g}")


def published_error(row: PublishedRow) -> str:
    """``+32%`` for a number, ``-`` for a claim (or nothing simulated)."""
    return "-" if row["error"] is None else f"{row['error']:+.0%}"


def published_table(rows: Sequence[PublishedRow]) -> Table:
    """Published vs simulated, one row per figure, with AIConfigurator's prediction where it ran."""
    held = sum(row["holds"] for row in rows)
    table = Table(title=f"published vs simulated: {held} of {len(rows)} figures hold (numbers within +-25%, "
                        f"claims on their side)")
    for col in ("case", "figure", "unit", "published", "simulated", "error", "holds", "AIConfigurator"):
        table.add_column(col, justify="left" if col in ("case", "figure") else "right")
    for row in rows:
        table.add_row(row["name"], row["metric"], row["unit"], published_claim(row),
                      published_number(row["simulated"], row["unit"]), published_error(row),
                      "yes" if row["holds"] else "no", published_number(row["aiconfigurator"], row["unit"]))
    return table


def published_lines(rows: Sequence[PublishedRow]) -> list[str]:
    """How each figure was simulated, AIConfigurator's notes, and the load model and kernel sources of each case,
    in words."""
    lines = []
    for row in rows:
        lines.append(f"{row['name']}, {row['metric']}: {row['detail']}")
        if row["aiconfigurator_note"] is not None:
            lines.append(f"  AIConfigurator: {row['aiconfigurator_note']}")
    seen: set[str] = set()
    for row in rows:
        if row["name"] in seen:
            continue
        seen.add(row["name"])
        lines.append(f"{row['name']} load: {row['load']}")
        by_source: dict[str, list[str]] = {}
        for kind, source in row["sources"].items():
            by_source.setdefault(source, []).append(kind)
        lines.append(f"{row['name']} kernel sources: " +
                     "; ".join(f"{', '.join(kinds)}: {source}" for source, kinds in by_source.items()))
    return lines
