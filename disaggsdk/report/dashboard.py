"""The Jupyter dashboard: the instance table and the latency plot, one cell output redrawn in place.

It is updated from the kernel: `refresh()` once, or `start()` a thread that refreshes every
``interval_s`` until `stop()`. Numbers come from `disaggsdk.report.live`; this file only renders.
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from disaggsdk.report.console import plain_text
from disaggsdk.report.live import InstanceRow, Served, instance_rows, latency_series
from disaggsdk.report.live_output import LiveOutput
from disaggsdk.report.live_table import instance_table
from disaggsdk.report.svg_plot import latency_svg

if TYPE_CHECKING:
    from disaggsdk.records.instance_stats import InstanceStats

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
    """Live view of a deployment in a notebook: the last expression of a cell, or ``display(dashboard)``.

    Args:
        served: returns the recent finished requests (``ServerMetrics.recent``).
        stats: returns the instance snapshots (``ServerMetrics.stats``).
        title: shown on top.
        interval_s: refresh period of `start`.

    Attributes:
        rows: the instance rows of the last refresh.
        table_html: those rows as an HTML table (`rows_html`).
        plot_svg: TTFT and inter-token latency over time, as an SVG document (`svg_plot.latency_svg`).
        output: the cell output it redraws (`live_output.LiveOutput`).
    """

    def __init__(self, served: Callable[[], Sequence[Served]], stats: Callable[[], Sequence[InstanceStats]],
                 title: str = "deployment", interval_s: float = 1.0):
        self._served, self._stats, self._title = served, stats, title
        self.interval_s = interval_s
        self.origin_s = time.monotonic()
        self.rows: list[InstanceRow] = []
        self.table_html = ""
        self.plot_svg = ""
        self.output = LiveOutput("dashboard")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # a refresh from the thread and one from a cell draw one after the other
        self.refresh()

    def refresh(self) -> list[InstanceRow]:
        """Recompute and redraw now (every place the dashboard is shown). Returns the rows shown."""
        served, stats, now = self._served(), self._stats(), time.monotonic()
        rows = instance_rows(served, stats, now)
        with self._lock:
            self.rows = rows
            self.table_html = rows_html(rows)
            self.plot_svg = latency_svg(latency_series(served, self.origin_s), title="TTFT and ITL over time (ms)")
            self.output.redraw(self.mimebundle())
        return rows

    def start(self) -> Dashboard:
        """Refresh every ``interval_s`` on a background thread until `stop`."""
        if self._thread is None and not self._stop.is_set():
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
        """Stop refreshing, after one last refresh: the picture that stays (in a saved notebook too)
        holds every request served until now. Idempotent; call it while the deployment still runs
        (`Deployment.shutdown` does, before it stops anything)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.refresh()
        except Exception:  # noqa: BLE001 - the deployment went down first: the last picture stays as it was
            return

    def _heading(self) -> str:
        return f"<b>{html.escape(self._title)}</b>"

    def snapshot_html(self) -> str:
        """The dashboard as of the last refresh, as static HTML: the title, the instance table and
        the latency plot (inline SVG); no script, so it shows wherever HTML does."""
        return f'<div class="disaggsdk-dashboard">{self._heading()}{self.table_html}{self.plot_svg}</div>'

    def mimebundle(self) -> dict[str, str]:
        """What a notebook shows of it: `snapshot_html` as text/html, the instance table as text/plain."""
        return {"text/html": self.snapshot_html(), "text/plain": str(self)}

    def _ipython_display_(self) -> None:
        # a display with an id, not a cell result: the thread's refreshes redraw it after the cell ended
        self.output.show(self.mimebundle())

    def __str__(self) -> str:
        return plain_text(instance_table(self.rows, title=self._title))
