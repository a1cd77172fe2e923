"""The Jupyter dashboard: an ipywidgets box with the instance table and the latency plot.

It is updated from the kernel: `refresh()` once, or `start()` a thread that refreshes every
``interval_s`` until `stop()`. Numbers come from `disaggsdk.report.live`; this file only renders.

Where widgets cannot run (a notebook exported to static HTML, GitHub, a viewer without the kernel)
the display falls back to a snapshot: the same table and plot as plain HTML and inline SVG, no
script. In Jupyter the widget's JavaScript comes from the installed ``jupyterlab_widgets`` /
``widgetsnbextension`` packages (dependencies of ipywidgets), never from a CDN.

nbconvert shows the snapshot when the notebook carries no widget state (JupyterLab saves none by
default). With widget state it picks the widget view and fetches its renderer from unpkg.com,
which no Python package ships: execute for export with
``jupyter nbconvert --execute --ExecutePreprocessor.store_widget_state=False --to html``.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from disaggsdk.report.console import plain_text
from disaggsdk.report.live import InstanceRow, Served, instance_rows, latency_series
from disaggsdk.report.live_table import instance_table
from disaggsdk.report.svg_plot import latency_svg

if TYPE_CHECKING:
    from disaggsdk.report.instance_stats import InstanceStats

COLUMNS = ("instance", "role", "reqs", "TTFT p50 ms", "TTFT p99 ms", "tok/s/req", "running", "waiting", "KV used",
           "xfer GB/s", "prefix cache hits", "drafts accepted")


def rows_html(rows: Sequence[InstanceRow]) -> str:
    """The instance rows as an HTML table."""

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            r.name if r.healthy else f"{r.name} (down)", r.role, r.num_requests, num(r.ttft_p50_ms, ".1f"),
            num(r.ttft_p99_ms, ".1f"), num(r.tokens_per_s_per_request, ".1f"), r.running, r.waiting,
            f"{r.kv_usage:.0%}", num(r.transfer_gb_per_s, ".2f"),
            "-" if r.prefix_cache_hit_rate is None else f"{r.prefix_cache_hit_rate:.0%}",
            "-" if r.spec_acceptance is None else f"{r.spec_acceptance:.0%}",
        )) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class Dashboard:
    """Live view of a deployment in a notebook.

    Args:
        served: returns the recent finished requests (``ServerMetrics.recent``).
        stats: returns the instance snapshots (``ServerMetrics.stats``).
        title: shown on top.
        interval_s: refresh period of `start`.
    """

    def __init__(self, served: Callable[[], Sequence[Served]], stats: Callable[[], Sequence[InstanceStats]],
                 title: str = "deployment", interval_s: float = 1.0):
        import ipywidgets as widgets

        self._served, self._stats, self._title = served, stats, title
        self.interval_s = interval_s
        self.origin_s = time.monotonic()
        self.table = widgets.HTML()  # rows_html of the last refresh
        self.plot = widgets.HTML()  # latency_svg of the last refresh
        self.widget = widgets.VBox([widgets.HTML(self._heading()), self.table, self.plot])
        self.rows: list[InstanceRow] = []  # of the last refresh
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refresh()

    def refresh(self) -> list[InstanceRow]:
        """Recompute and redraw now. Returns the rows shown."""
        served, now = self._served(), time.monotonic()
        rows = instance_rows(served, self._stats(), now)
        self.rows = rows
        self.table.value = rows_html(rows)
        self.plot.value = latency_svg(latency_series(served, self.origin_s), title="TTFT and ITL over time (ms)")
        return rows

    def start(self) -> Dashboard:
        """Refresh every ``interval_s`` on a background thread until `stop`."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dashboard", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception:  # noqa: BLE001 - a deployment shutting down under the dashboard: stop quietly
                return

    def stop(self) -> None:
        """Stop refreshing (the last picture stays). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _heading(self) -> str:
        return f"<b>{html.escape(self._title)}</b>"

    def snapshot_html(self) -> str:
        """The dashboard as of the last refresh, as static HTML: the title, the instance table and
        the latency plot (inline SVG); no script, so it shows wherever HTML does."""
        return f'<div class="disaggsdk-dashboard">{self._heading()}{self.table.value}{self.plot.value}</div>'

    def _repr_mimebundle_(self, **kwargs: object) -> dict[str, object]:
        # the widget view for a live kernel, and the snapshot as text/html beside it: a renderer
        # that cannot run the widget (nbconvert without widget state, GitHub) shows the snapshot
        bundle: dict[str, object] = dict(self.widget._repr_mimebundle_(**kwargs))
        bundle["text/html"] = self.snapshot_html()
        bundle["text/plain"] = plain_text(instance_table(self.rows, title=self._title))  # not VBox(children=...)
        return bundle
