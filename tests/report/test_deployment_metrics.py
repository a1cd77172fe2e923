"""`Deployment.metrics()` shows as a table (HTML, rich, print) and gives typed rows and a DataFrame."""

from __future__ import annotations

import sys

import pytest
from rich.console import Console

from disaggsdk.records.instance_stats import InstanceStats
from disaggsdk.report.deployment_metrics import DeploymentMetrics
from disaggsdk.report.latency import RequestTimeline
from disaggsdk.report.live import instance_rows
from disaggsdk.serve.metrics import ServedRequest

STATS = [InstanceStats("prefill-0", "prefill"),
         InstanceStats("decode-0", "decode", running=2, waiting=1, kv_pages_used=25, kv_pages_total=100)]


def metrics() -> DeploymentMetrics:
    served = [ServedRequest("decode-0", RequestTimeline(0.0, [0.1, 0.11, 0.12], prompt_tokens=4), "length", 0.12)]
    return DeploymentMetrics(1, tuple(instance_rows(served, STATS, now_s=1.0)), "tiny-local")


def test_typed_rows_and_a_row_by_name():
    m = metrics()
    assert [r.name for r in m.rows] == ["prefill-0", "decode-0"]
    assert m.row("decode-0").num_requests == 1 and m.row("prefill-0").ttft_p50_ms is None
    with pytest.raises(KeyError, match="the instances are prefill-0, decode-0"):
        m.row("decode-9")


def test_html_is_the_instance_table_with_a_dash_for_none():
    page = metrics()._repr_html_()
    assert page.count("<table>") == 1 and "<th>TTFT p50 ms</th>" in page and "<td>decode-0</td>" in page
    assert "None" not in page and "<td>-</td>" in page  # prefill-0 served nothing: its latencies are '-'
    assert "tiny-local: 1 requests served" in page


def test_print_and_rich_show_the_whole_table():
    m = metrics()
    text = str(m)
    assert "None" not in text and "…" not in text
    assert "decode-0" in text and "TTFT p50" in text and "25%" in text and len(text.splitlines()) < 15
    console = Console(record=True, width=200)
    console.print(m)
    assert "tiny-local: 1 requests served" in console.export_text()
    assert repr(m) == "<DeploymentMetrics tiny-local: 2 instances, 1 served>"


def test_frame_is_indexed_by_instance_with_a_column_per_field():
    pytest.importorskip("pandas")
    frame = metrics().frame()
    assert list(frame.index) == ["prefill-0", "decode-0"]
    assert frame.loc["decode-0", "ttft_p50_ms"] == pytest.approx(100.0)
    assert frame.loc["decode-0", "running"] == 2 and frame["ttft_p50_ms"].isna().tolist() == [True, False]


def test_frame_without_pandas_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` raises ModuleNotFoundError
    with pytest.raises(ModuleNotFoundError, match=r"^DeploymentMetrics.frame\(\) needs pandas: "
                                                  r"pip install 'disaggsdk\[notebook\]'$"):
        metrics().frame()
