"""The plots of a layout comparison (`calibrate.layout_compare`): SLO attainment against the request
rate, and TTFT against TPOT, one series per layout; matplotlib, imported only when a plot is drawn.

They take the comparison's JSON (plain dicts), so a saved result can be drawn again anywhere.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PLOT_SUFFIXES = (".png", ".svg", ".html")


def _rate(run: Mapping[str, Any]) -> float:
    """Where a run sits on the rate axis: its rate, or for the flat-out run the rate it completed."""
    rate = run["request_rate"]
    return float(run["request_throughput"]) if isinstance(rate, str) else float(rate)


def _runs(sweep: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A sweep's runs in rate order (`_rate`)."""
    return sorted(sweep["sweep"], key=_rate)


def _attainment(ax: Axes, layouts: Sequence[Mapping[str, Any]], target: float, title: str) -> None:
    for i, layout in enumerate(layouts):
        color = f"C{i}"
        for key, style in (("measured", "-o"), ("simulated", "--x")):
            sweep = layout.get(key)
            if not sweep:
                continue
            runs = _runs(sweep)
            ax.plot([_rate(r) for r in runs], [r["slo_attainment"] for r in runs], style, color=color,
                    label=f"{layout['layout']} ({key})", markersize=4)
        ax.axvline(layout["goodput_request_rate"], color=color, alpha=0.3, linewidth=3)
    ax.axhline(target, color="grey", linestyle=":", label=f"target {target:.0%}")
    ax.set_xlabel("request rate (req/s; flat out: the rate completed)")
    ax.set_ylabel("SLO attainment")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def _latency(ax: Axes, layouts: Sequence[Mapping[str, Any]], slos_ms: Mapping[str, float], title: str) -> None:
    """Median TTFT against median TPOT of each run: the Pareto view, with the SLO box."""
    for i, layout in enumerate(layouts):
        sweep = layout.get("measured") or layout["simulated"]
        runs = [r for r in _runs(sweep) if r.get("median_ttft_ms") is not None and r.get("median_tpot_ms") is not None]
        ax.plot([r["median_tpot_ms"] for r in runs], [r["median_ttft_ms"] for r in runs], "o", color=f"C{i}",
                label=layout["layout"], markersize=4)
    if "tpot" in slos_ms:
        ax.axvline(slos_ms["tpot"], color="grey", linestyle=":")
    if "ttft" in slos_ms:
        ax.axhline(slos_ms["ttft"], color="grey", linestyle=":")
    ax.set_xlabel("median TPOT (ms)")
    ax.set_ylabel("median TTFT (ms)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)


def comparison_figure(comparison: Mapping[str, Any]) -> Figure:
    """One row per place compared (this machine, then each target): attainment vs rate, TTFT vs TPOT."""
    from matplotlib.figure import Figure

    rows: list[tuple[str, Sequence[Mapping[str, Any]]]] = [("this machine (measured, simulated dashed)",
                                                             comparison["this_machine"])]
    rows += [(f"{t['spec']} on {t['profile']} (simulated)", t["layouts"]) for t in comparison["targets"]]
    fig = Figure(figsize=(11, 3.6 * len(rows)), layout="constrained")
    axes = fig.subplots(len(rows), 2, squeeze=False)
    for (title, layouts), (left, right) in zip(rows, axes):
        _attainment(left, layouts, comparison["slo_attainment_target"], title)
        _latency(right, layouts, comparison["slos_ms"], title)
    return fig


def save_figure(fig: Figure, path: str | Path, summary_html: str = "") -> Path:
    """Write ``fig`` as PNG, SVG or an HTML page (the PNG inline, ``summary_html`` above it).

    Raises:
        ValueError: a suffix other than .png, .svg or .html.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise ValueError(f"{path}: a plot is saved as {', '.join(PLOT_SUFFIXES)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix != ".html":
        fig.savefig(path, dpi=110)
        return path
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    image = base64.b64encode(buf.getvalue()).decode()
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(path.stem)}</title>"
                    f"</head><body>{summary_html}<img alt='layout comparison' src='data:image/png;base64,{image}'>"
                    f"</body></html>\n")
    return path
