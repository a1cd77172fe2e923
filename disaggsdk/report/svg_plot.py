"""A small SVG plot of TTFT and inter-token latency over time, for the notebook dashboard.

Plain SVG text keeps the dashboard free of a plotting library: it is part of the dashboard's HTML.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from disaggsdk.report.live import LatencySeries

MAX_POINTS = 2000  # per series; beyond that every k-th point is drawn
COLORS = {"TTFT": "#d62728", "ITL": "#1f77b4"}


def _thin(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    step = max(1, len(points) // MAX_POINTS)
    return list(points[::step])


def _tick(value: float) -> str:
    # whole numbers from 10 up; two significant digits below, so a 3-second run reads 0, 1.5, 3
    return f"{value:.0f}" if value == 0 or abs(value) >= 10 else f"{value:.2g}"


def latency_svg(series: LatencySeries, width: int = 640, height: int = 240, title: str = "") -> str:
    """An SVG document: TTFT (dots) and ITL (dots) in ms against seconds, shared axes.

    Args:
        series: the points (from `disaggsdk.report.live.latency_series`).
        width, height: pixels.
        title: shown above the plot.
    """
    pad_l, pad_r, pad_t, pad_b = 56, 12, 24, 32
    named = {"TTFT": _thin(series.ttft), "ITL": _thin(series.itl)}
    xs = [x for pts in named.values() for x, _ in pts] or [0.0, 1.0]
    ys = [y for pts in named.values() for _, y in pts] or [0.0, 1.0]
    x0, x1 = min(xs), max(max(xs), min(xs) + 1e-9)
    y1 = max(max(ys), 1e-9) * 1.05
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b

    def px(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return pad_t + plot_h - y / y1 * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="11">',
             f'<text x="{pad_l}" y="14">{html.escape(title)}</text>',
             f'<rect x="{pad_l}" y="{pad_t}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>']
    empty = not any(named.values())
    for frac in () if empty else (0.0, 0.5, 1.0):  # an empty plot has no scale to label
        y = y1 * frac
        parts.append(f'<text x="{pad_l - 4}" y="{py(y) + 4:.1f}" text-anchor="end">{_tick(y)}</text>')
        x = x0 + (x1 - x0) * frac
        parts.append(f'<text x="{px(x):.1f}" y="{height - 16}" text-anchor="middle">{_tick(x)}</text>')
    parts.append(f'<text x="{pad_l + plot_w / 2}" y="{height - 2}" text-anchor="middle">seconds</text>')
    parts.append(f'<text x="12" y="{pad_t + plot_h / 2}" transform="rotate(-90 12 {pad_t + plot_h / 2})" '
                 f'text-anchor="middle">ms</text>')
    if empty:  # a dashboard shown at launch: say why the plot is empty
        parts.append(f'<text x="{pad_l + plot_w / 2}" y="{pad_t + plot_h / 2}" text-anchor="middle" '
                     f'fill="#999">no requests yet</text>')
    for i, (name, pts) in enumerate(named.items()):
        color = COLORS[name]
        radius = 2.5 if name == "TTFT" else 1.2
        parts.extend(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{radius}" fill="{color}"/>' for x, y in pts)
        parts.append(f'<text x="{pad_l + plot_w - 80 + i * 40}" y="14" fill="{color}">{name}</text>')
    parts.append("</svg>")
    return "".join(parts)
