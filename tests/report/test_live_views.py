"""Live numbers are pure functions of timelines and snapshots; the table, plot and dashboard render them."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.records.unit_counters import UnitCounters
from disaggsdk.report.latency import RequestTimeline
from disaggsdk.report.live import instance_rows, latency_series
from disaggsdk.report.live_table import instance_table, summary_table
from disaggsdk.report.svg_plot import latency_svg
from disaggsdk.serve.metrics import ServedRequest


def served(instance: str, sent: float, times: list[float], ended: float) -> ServedRequest:
    return ServedRequest(instance, RequestTimeline(sent, times, prompt_tokens=4), "length", ended)


STATS = [
    InstanceStats("prefill-0", "prefill", counters=UnitCounters(transfer_bytes=2_000_000_000, transfer_s=0.5)),
    InstanceStats("decode-0", "decode", running=2, waiting=1, kv_pages_used=25, kv_pages_total=100),
]


def test_instance_rows_window_percentiles_speed_kv_and_transfer():
    reqs = [
        served("decode-0", 0.0, [0.1, 0.11, 0.12], ended=0.12),  # TTFT 100 ms, 10 ms per token
        served("decode-0", 1.0, [1.3, 1.32, 1.34], ended=1.34),  # TTFT 300 ms, 20 ms per token
        served("decode-0", -100.0, [-99.0], ended=-99.0),  # outside the window
    ]
    prefill, decode = instance_rows(reqs, STATS, now_s=2.0, window_s=30.0)
    assert prefill.ttft_p50_ms is None and prefill.transfer_gb_per_s == pytest.approx(4.0)
    assert decode.num_requests == 2
    assert decode.ttft_p50_ms == pytest.approx(200.0) and decode.ttft_p99_ms == pytest.approx(298.0)
    assert decode.tokens_per_s_per_request == pytest.approx((100 + 50) / 2)
    assert (decode.running, decode.waiting, decode.kv_usage) == (2, 1, 0.25)
    assert decode.transfer_gb_per_s is None


def test_latency_series_puts_ttft_at_first_token_and_gaps_at_later_tokens():
    s = latency_series([served("d", 10.0, [10.5, 10.6, 10.8], 10.8)], origin_s=10.0)
    assert s.ttft == [(pytest.approx(0.5), pytest.approx(500.0))]
    # seconds and milliseconds made from float64 sums of 10.x times: exact to ~1e-12
    assert [x for x, _ in s.itl] == pytest.approx([0.6, 0.8], rel=0, abs=1e-9)
    assert [y for _, y in s.itl] == pytest.approx([100, 200], rel=0, abs=1e-6)


def test_tables_and_plot_render():
    rows = instance_rows([served("decode-0", 0.0, [0.1, 0.2], 0.2)], STATS, now_s=1.0)
    console = Console(record=True, width=160)
    console.print(instance_table(rows))
    console.print(summary_table([("disaggregated", {"p99_itl_ms": 1.5, "completed": 3}),
                                 ("colocated", {"p99_itl_ms": 4.0, "completed": 3})]))
    text = console.export_text()
    assert "decode-0" in text and "4.00" in text and "25%" in text
    assert "acc" not in text.split("\n")[1]  # no drafting instance: no acceptance column
    assert "p99_itl_ms" in text and "colocated" in text
    svg = latency_svg(latency_series([served("d", 0.0, [0.1, 0.2, 0.3], 0.3)], 0.0), title="t")
    assert svg.startswith("<svg") and svg.count("<circle") == 3
    empty = latency_svg(latency_series([], 0.0))  # before any request
    assert empty.startswith("<svg") and "no requests yet" in empty and "no requests yet" not in svg
    assert 'text-anchor="end"' not in empty  # no axis labels on an empty scale
    # seconds 0.1..0.3 and ms 0..105: the ticks read 0.1, 0.2, 0.3 and 0, 52, 105 (not 0, 0, 0)
    assert all(f">{tick}</text>" in svg for tick in ("0.1", "0.2", "0.3", "0", "52", "105"))


def test_dashboard_refreshes_from_its_sources():
    from disaggsdk.report.dashboard import Dashboard

    reqs: list[ServedRequest] = []
    dash = Dashboard(lambda: reqs, lambda: STATS, title="demo", interval_s=0.01)
    assert "decode-0" in dash.table_html and "no requests yet" in dash.plot_svg
    import time

    now = time.monotonic()
    reqs.append(served("decode-0", now - 0.2, [now - 0.1, now], now))
    rows = dash.refresh()
    assert rows[1].num_requests == 1 and "<circle" in dash.plot_svg and dash.rows == rows
    dash.start()
    dash.stop()


def test_dashboard_stop_draws_a_last_picture_and_survives_a_source_gone():
    """What stays (in a saved notebook too) holds every request served until `stop`; a deployment that
    went down first leaves the picture as it was instead of failing its shutdown."""
    from disaggsdk.report.dashboard import Dashboard

    reqs: list[ServedRequest] = []
    dash = Dashboard(lambda: reqs, lambda: STATS, title="demo", interval_s=3600)  # the thread never refreshes
    dash.start()
    reqs.append(served("decode-0", 0.0, [0.1, 0.2], 0.2))
    dash.stop()
    assert "<circle" in dash.plot_svg
    dash.stop()  # idempotent

    def gone() -> list[InstanceStats]:
        raise ConnectionError("the backend is closed")

    broken = Dashboard(lambda: reqs, lambda: STATS, title="demo")
    broken._stats = gone
    broken.stop()
    assert "<td>decode-0</td>" in broken.table_html  # the picture before


def test_dashboard_shows_a_static_html_snapshot_and_a_text_table_never_a_widget():
    """No widget: what a kernel shows is what a saved notebook and nbconvert's HTML export keep (no
    widget state, so no widget manager from a CDN); outside a kernel nothing is redrawn."""
    from disaggsdk.report.dashboard import Dashboard
    from disaggsdk.report.live_output import in_kernel

    dash = Dashboard(lambda: [served("decode-0", 0.0, [0.1, 0.2], 0.2)], lambda: STATS, title="demo")
    bundle = dash.mimebundle()
    assert set(bundle) == {"text/html", "text/plain"}
    snapshot = bundle["text/html"]
    assert snapshot == dash.snapshot_html() and "<script" not in snapshot
    assert "<b>demo</b>" in snapshot and "<td>decode-0</td>" in snapshot and "<svg" in snapshot
    assert "decode-0" in bundle["text/plain"] and "TTFT p50" in bundle["text/plain"] and str(dash) == bundle["text/plain"]
    assert not in_kernel() and not dash.output.shown
    assert dash.output.display_id.startswith("disaggsdk-dashboard-")


def test_startup_status_outside_a_kernel_prints_each_line_on_stdout(capsys):
    """A script or a terminal scrolls the lines by (stdout, not stderr); the kernel's redrawn output is
    tests/notebooks/test_live_outputs.py's."""
    from disaggsdk.report.startup_status import StartupStatus

    status = StartupStatus()
    lines = ["decode-0: loading weights", "decode-0: ready after 1.0 s", "ready in 1.2 s: http://x/v1"]
    for line in lines:
        status(line)
    out = capsys.readouterr()
    assert out.out.splitlines() == lines == status.lines and out.err == ""


def test_rows_and_tables_show_speculative_acceptance_where_an_instance_drafts():
    stats = [*STATS, InstanceStats("decode-1", "decode", counters=UnitCounters(
        spec_num_drafts=40, spec_num_draft_tokens=40, spec_num_accepted_tokens=30, spec_accepted_per_position=[30]))]
    rows = instance_rows([], stats, now_s=1.0)
    assert [r.spec_acceptance for r in rows] == [None, None, 0.75]
    console = Console(record=True, width=200)
    console.print(instance_table(rows))
    text = console.export_text()
    assert "75%" in text and "acc: speculative drafts accepted" in text
    from disaggsdk.report.dashboard import rows_html

    assert "<th>drafts accepted</th>" in rows_html(rows) and "<td>75%</td>" in rows_html(rows)


def test_bench_report_is_the_vllm_dict_and_prints_the_table_the_cli_prints():
    from IPython.lib.pretty import pretty

    from disaggsdk.report.bench_report import BenchReport

    results = {"completed": 16, "failed": 0, "request_throughput": 7.9, "median_ttft_ms": 120.25,
               "p99_itl_ms": None, "p99.9_ttft_ms": 300.0, "date": "20260101-000000"}
    report = BenchReport(results, "tiny (disaggregated)")
    assert report == results and json.loads(json.dumps(report)) == results and report["completed"] == 16
    console = Console(width=400, record=True, color_system=None)
    console.print(summary_table([("tiny (disaggregated)", results)]))
    terminal = "\n".join(line.rstrip() for line in console.export_text().splitlines())
    assert str(report) == terminal == pretty(report)  # print(), IPython's text view and `disaggsdk bench`
    assert "median_ttft_ms" in str(report) and "120.25" in str(report) and "p99.9_ttft_ms" in str(report)
    assert "date" not in str(report) and "{" not in str(report)
    html = report._repr_html_()
    assert "<th>tiny (disaggregated)</th>" in html and "<td>median_ttft_ms</td><td>120.25</td>" in html
    assert "<td>p99_itl_ms</td><td>-</td>" in html and "<script" not in html
