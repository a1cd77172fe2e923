"""The live per-instance table in the terminal (rich). Renders `disaggsdk.report.live` rows."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from disaggsdk.report.live import InstanceRow

REFRESH_PER_S = 2.0
CAPTION = "TTFT in ms over the last 30 s; tok/s per request; run/wait: requests running/queued; KV: pages used"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def instance_table(rows: Sequence[InstanceRow], title: str = "instances") -> Table:
    """A rich table of ``rows``: TTFT p50/p99, tokens/s per request, queue, KV usage, transfer GB/s;
    under it, each instance's prefix cache hit rate (where it looked anything up)."""
    # short headers so the table fits an 80-column terminal; the caption spells them out
    # the acceptance column only where an instance drafts: the table must fit 80 columns without it;
    # the hit rates go in the caption, which wraps: a column would not fit (prefix caching is on by default)
    drafting = any(r.spec_acceptance is not None for r in rows)
    caption = CAPTION + ("; acc: speculative drafts accepted" if drafting else "")
    hits = [f"{r.name} {r.prefix_cache_hit_rate:.0%}" for r in rows if r.prefix_cache_hit_rate is not None]
    if hits:
        caption += "; prefix cache hits (prompt tokens found cached): " + ", ".join(hits)
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    headers = ("instance", "role", "reqs", "TTFT p50", "TTFT p99", "tok/s", "run", "wait", "KV", "xfer GB/s")
    for header in headers + (("acc",) if drafting else ()):
        left = header in ("instance", "role")
        table.add_column(header, justify="left" if left else "right", no_wrap=left)
    for r in rows:
        name = r.name if r.healthy else f"[red]{r.name} (down)[/]"
        cells = [name, r.role, str(r.num_requests), _num(r.ttft_p50_ms, ".0f"), _num(r.ttft_p99_ms, ".0f"),
                 _num(r.tokens_per_s_per_request, ".0f"), str(r.running), str(r.waiting), f"{r.kv_usage:.0%}",
                 _num(r.transfer_gb_per_s, ".2f")]
        if drafting:
            cells.append("-" if r.spec_acceptance is None else f"{r.spec_acceptance:.0%}")
        table.add_row(*cells)
    return table


def summary_rows(results: Sequence[tuple[str, Mapping[str, object]]]) -> list[tuple[str, ...]]:
    """The cells of the benchmark table: a row per metric any run has (vLLM field names first, in a
    fixed order, then the extra TTFT/ITL percentiles asked for), the metric's name then one cell per run
    (``-`` where a run lacks it or it is None; floats with two decimals)."""
    keys = ["completed", "failed", "duration", "request_throughput", "output_throughput", "request_goodput",
            "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
            "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "mean_tokens_per_s_per_request"]
    # extra TTFT/ITL percentiles asked for (p99.9...) follow the fixed rows
    keys += sorted({k for _, r in results for k in r if re.fullmatch(r"p[\d.]+_(ttft|itl)_ms", k)} - set(keys)
                   - {f"p{p}_{m}_ms" for p in (50, 90) for m in ("ttft", "itl")})
    rows = []
    for key in keys:
        if not any(key in r for _, r in results):
            continue
        cells = [r.get(key) for _, r in results]
        rows.append((key, *("-" if c is None else f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells)))
    return rows


def summary_table(results: Sequence[tuple[str, Mapping[str, object]]]) -> Table:
    """Benchmark results side by side (one column per run), vLLM field names as row labels (`summary_rows`)."""
    table = Table(title="benchmark", title_justify="left")
    table.add_column("metric")
    for name, _ in results:
        table.add_column(name, justify="right")
    for row in summary_rows(results):
        table.add_row(*row)
    return table


class LiveView:
    """A rich Live display refreshed from ``render`` (call it inside ``with``).

    Args:
        render: builds the current renderable (table, progress bar...).
        console: where to draw (stdout by default).
    """

    def __init__(self, render: Callable[[], RenderableType | Sequence[RenderableType]], console: Console | None = None):
        self._render = render
        self._console = console
        self._live: Live | None = None

    def _current(self) -> RenderableType:
        out = self._render()
        return out if isinstance(out, str) or not isinstance(out, Sequence) else Group(*out)

    def __enter__(self) -> LiveView:
        self._live = Live(self._current(), console=self._console, refresh_per_second=REFRESH_PER_S,
                          get_renderable=self._current)
        self._live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        assert self._live is not None
        self._live.__exit__(exc_type, exc, traceback)
        self._live.console.line()  # what follows starts on a fresh line, also when not a terminal

    def wait(self, seconds: float) -> None:
        """Sleep while the display keeps refreshing itself."""
        time.sleep(seconds)
