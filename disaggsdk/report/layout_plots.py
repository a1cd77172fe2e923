"""The plots of a layout comparison (`calibrate.layout_compare`): SLO attainment against the request
rate, and TTFT against TPOT, one series per layout; matplotlib, imported only when a plot is drawn.

They take the comparison's record (`records.goodput_records.Comparison`, JSON as it is), so a saved
result can be loaded and drawn again anywhere.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from disaggsdk.records.goodput_records import Comparison, GoodputSweep, LayoutGoodput, SweepRow

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PLOT_SUFFIXES = (".png", ".svg", ".html")


def _rate(run: SweepRow) -> float:
    """Where a run sits on the rate axis: its rate, or for the flat-out run the rate it completed."""
    rate = run["request_rate"]
    return float(run["request_throughput"]) if isinstance(rate, str) else float(rate)


def _runs(sweep: GoodputSweep) -> list[SweepRow]:
    """A sweep's runs in rate order (`_rate`)."""
    return sorted(sweep["sweep"], key=_rate)


def _attainment(ax: Axes, layouts: Sequence[LayoutGoodput], target: float, title: str) -> None:
    for i, layout in enumerate(layouts):
        color = f"C{i}"
        for sweep, key, style in ((layout["measured"], "measured", "-o"), (layout["simulated"], "simulated", "--x")):
            if sweep is None:
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


def _latency(ax: Axes, layouts: Sequence[LayoutGoodput], slos_ms: dict[str, float], title: str) -> None:
    """Median TTFT against median TPOT of each run: the Pareto view, with the SLO box."""
    for i, layout in enumerate(layouts):
        sweep = layout["measured"] or layout["simulated"]
        points = [(r["median_tpot_ms"], r["median_ttft_ms"]) for r in _runs(sweep)]
        shown = [(tpot, ttft) for tpot, ttft in points if tpot is not None and ttft is not None]
        ax.plot([tpot for tpot, _ in shown], [ttft for _, ttft in shown], "o", color=f"C{i}",
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


def comparison_figure(comparison: Comparison) -> Figure:
    """One row per place compared (this machine, then each target): attainment vs rate, TTFT vs TPOT."""
    from matplotlib.figure import Figure

    rows: list[tuple[str, Sequence[LayoutGoodput]]] = [("this machine (measured, simulated dashed)",
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
    image = png_base64(fig)
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(path.stem)}</title>"
                    f"</head><body>{summary_html}<img alt='layout comparison' src='data:image/png;base64,{image}'>"
                    f"</body></html>\n")
    return path


def png_base64(fig: Figure, dpi: int = 110) -> str:
    """``fig`` as a base64 PNG, for an ``<img src="data:image/png;base64,...">`` in a page or a notebook."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return base64.b64encode(buf.getvalue()).decode()
