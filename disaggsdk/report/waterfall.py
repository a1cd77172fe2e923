"""One request's spans drawn as a waterfall: a row per span, its bar from its start to its end,
colored by the unit that recorded it, indented under its parent.

Measurement is elsewhere (the units' `records.span_records`, turned into OpenTelemetry spans by
`serve.tracing.request_tracing`); this only draws `TimelineSpan`s. matplotlib is imported when a figure is
drawn, never before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from disaggsdk.records.span_records import AttributeValue

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROW_HEIGHT_IN = 0.22  # inches per span in the figure
MAX_ROWS = 600  # a figure taller than this says how many spans it left out
MIN_WIDTH_SHARE = 0.002  # of the whole request: the narrowest bar drawn
LABEL_FONT_PT = 7
MONOSPACE_WIDTH = 0.62  # a monospace character's width, in font sizes


@dataclass(frozen=True)
class TimelineSpan:
    """One finished span of a request's trace, as the waterfall reads it.

    Attributes:
        name: what ran ("layer 3 transfer", "first step").
        unit: who recorded it ("router", "prefill-0", "decode-0").
        start_ns, end_ns: epoch nanoseconds.
        span_id: its id (hex); ``parent_id`` its parent's (None: a root).
        attributes: what the recorder added (bytes, batch size, ...).
    """

    name: str
    unit: str
    start_ns: int
    end_ns: int
    span_id: str
    parent_id: str | None = None
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)


def span_rows(spans: Sequence[TimelineSpan]) -> list[tuple[TimelineSpan, int]]:
    """The spans in waterfall order with their depth: each parent followed by its children, siblings
    by start time; a span whose parent is not among ``spans`` is a root."""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[TimelineSpan]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
    rows: list[tuple[TimelineSpan, int]] = []
    stack = [(s, 0) for s in sorted(children.get(None, []), key=lambda s: (s.start_ns, -s.end_ns), reverse=True)]
    while stack:
        span, depth = stack.pop()
        rows.append((span, depth))
        kids = sorted(children.get(span.span_id, []), key=lambda s: (s.start_ns, -s.end_ns), reverse=True)
        stack += [(k, depth + 1) for k in kids]
    return rows


def waterfall(spans: Sequence[TimelineSpan], title: str = "") -> Figure:
    """Draw a request's spans as a waterfall.

    Args:
        spans: the spans of one trace (`Deployment.trace`, `serve.tracing.request_tracing.timeline_spans`).
        title: the figure's title ("" for none).
    Returns:
        a matplotlib ``Figure`` (shows itself in Jupyter; ``savefig`` writes a PNG or SVG), times in
        milliseconds from the earliest span's start.
    Raises:
        ValueError: no spans.
        ImportError: matplotlib is missing (the ``notebook`` extra).
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    if not spans:
        raise ValueError("no spans to draw: was the request traced (serve.otlp_traces_endpoint, or a span exporter)?")
    rows = span_rows(spans)
    left_out = max(0, len(rows) - MAX_ROWS)
    rows = rows[:MAX_ROWS]
    t0 = min(s.start_ns for s in spans)
    units = list(dict.fromkeys(s.unit for s, _ in rows))
    palette = colormaps["tab10"]
    color = {u: palette(i % 10) for i, u in enumerate(units)}
    fig = Figure(figsize=(11, 1.2 + ROW_HEIGHT_IN * len(rows)), layout="constrained")
    ax = fig.subplots()
    # a span of no measurable length still shows, as a sliver of the whole
    min_width_ms = (max(s.end_ns for s, _ in rows) - t0) / 1e6 * MIN_WIDTH_SHARE
    for y, (s, _depth) in enumerate(rows):
        start_ms, width_ms = (s.start_ns - t0) / 1e6, max(0, s.end_ns - s.start_ns) / 1e6
        ax.barh(y, max(width_ms, min_width_ms), left=start_ms, height=0.7, color=color[s.unit])
    # names left-aligned, so that the indentation shows each span's depth under its parent
    labels = ["  " * depth + s.name for s, depth in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=LABEL_FONT_PT, family="monospace", horizontalalignment="left")
    ax.tick_params(axis="y", pad=max(len(label) for label in labels) * LABEL_FONT_PT * MONOSPACE_WIDTH + 4)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first span on top
    ax.set_xlabel("ms since the request's first span began")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color=color[u], label=u) for u in units], loc="lower right", fontsize=8)
    note = f" ({left_out} more spans not drawn)" if left_out else ""
    if title or note:
        ax.set_title(title + note)
    return fig
