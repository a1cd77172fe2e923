"""The notebooks are part of the product: each one is executed top to bottom in a real kernel.

The quickstart is executed once per session (the `quickstart` fixture) and read twice: for what
its cells print and show, and exported to static HTML, as a reader without a kernel sees it, in a
real headless browser.
"""

import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
# git-ignored; CI can upload it: the exported HTML and the browser's screenshot of it
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
DASHBOARD_HEADERS = ("TTFT p50 ms", "TTFT p99 ms", "tok/s/req", "KV used", "xfer GB/s")
INSTANCES = ("prefill-0", "decode-0", "decode-1")


def execute(name: str, store_widget_state: bool = True) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", store_widget_state=store_widget_state,
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def outputs_of(nb: nbformat.NotebookNode) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


@pytest.fixture(scope="module")
def quickstart() -> nbformat.NotebookNode:
    # saved without widget state, as JupyterLab saves a notebook by default: with it, nbconvert
    # would pick the widget view and fetch its renderer from unpkg.com; without it, the HTML
    # export shows the dashboard's text/html snapshot and loads no script
    return execute("quickstart.ipynb", store_widget_state=False)


def test_quickstart_runs_and_shows_the_plans_as_html(quickstart):
    outs = outputs_of(quickstart)
    assert not [o for o in outs if o.output_type == "error"]
    html = [o for o in outs if o.output_type == "execute_result" and "text/html" in o.data]
    assert len(html) >= 2  # the tp=8 plan and the tp=4 plan
    assert "decode-0" in html[0].data["text/html"]
    text = "".join(o.get("text", "") for o in outs if o.output_type == "stream")
    assert "def fibonacci(n):\n    " in text  # the trained tiny model writes a function body


def test_quickstart_metrics_and_dashboard_show_tables_not_dicts(quickstart):
    shown = [o.data for o in outputs_of(quickstart) if o.output_type in ("execute_result", "display_data")]
    metrics = next(d for d in shown if "DeploymentMetrics" in d.get("text/plain", "") or
                   "requests served" in d.get("text/html", "") and "disaggsdk-dashboard" not in d["text/html"])
    assert "<th>TTFT p50 ms</th>" in metrics["text/html"] and "None" not in metrics["text/html"]
    dashboards = [d for d in shown if "application/vnd.jupyter.widget-view+json" in d]
    assert len(dashboards) == 2  # at launch, and after the benchmark
    for d in dashboards:  # beside the widget view: the static snapshot and a text table
        assert 'class="disaggsdk-dashboard"' in d["text/html"] and "<svg" in d["text/html"]
        assert "decode-1" in d["text/plain"] and "VBox" not in d["text/plain"]
    assert "<circle" in dashboards[1]["text/html"]  # the benchmark's requests are on the plot
    assert "widgets" not in quickstart.metadata


def test_quickstart_exported_to_html_shows_the_dashboard_in_a_headless_browser(quickstart, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed: `make sysdeps` installs it (Debian package chromium)")
    from nbconvert import HTMLExporter

    page, _ = HTMLExporter(template_name="lab").from_notebook_node(quickstart)  # `jupyter nbconvert --to html`
    # no widget manager from unpkg.com; the template's own require.js and MathJax links (for
    # JavaScript and LaTeX outputs, of which the quickstart has none) stay, and fail offline
    assert "widget-view+json" not in page and "unpkg.com" not in page and "html-manager" not in page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    html_path, png_path = ARTIFACTS / "quickstart.html", ARTIFACTS / "quickstart.png"
    html_path.write_text(page)
    png_path.unlink(missing_ok=True)
    # offline for certain (no proxy reachable, every host name unresolvable), a profile of its own;
    # the window is as tall as the page, so the screenshot holds both dashboards
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path}",
         "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1280,9000",
         f"--screenshot={png_path}", "--dump-dom", html_path.as_uri()],
        capture_output=True, text=True, timeout=120, check=True).stdout
    print(f"\nthe exported quickstart and its screenshot: {html_path}, {png_path}")
    snapshots = dom.split('class="disaggsdk-dashboard"')[1:]
    assert len(snapshots) == 2, "the dashboard cells rendered blank"
    for snapshot in snapshots:
        table = snapshot.split("</table>")[0]
        assert all(f"<th>{h}</th>" in table for h in DASHBOARD_HEADERS)
        assert all(f"<td>{name}</td>" in table for name in INSTANCES)
    assert png_path.stat().st_size > 10_000


@pytest.mark.slow  # 27 s; the quickstart notebook is the default run's executed notebook
def test_simulate_notebook_compares_layouts_and_names_its_disagreements():
    nb = execute("simulate.ipynb")
    outs = outputs_of(nb)
    assert not [o for o in outs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outs if o.output_type == "stream")
    assert "best:" in text and "1P:3D > 90 tok/s at ~1 QPS/decode node (MTP)" in text
    assert sum(1 for o in outs if o.output_type == "display_data" and "image/png" in o.data) == 2


def test_walkthrough_compares_layouts_on_the_shipped_trace_and_draws_a_request_waterfall(tmp_path, monkeypatch):
    """The walkthrough executed top to bottom: the comparison's table, plots and recommendation, then one
    traced request's waterfall. The kernel gets a DISAGGSDK_HOME whose cpu-local profile is a datasheet's with
    the serving fields set, so that it does not calibrate this machine for minutes first; what the
    notebook shows of the simulator here is then not this machine's, and nothing below reads it."""
    import attrs

    from disaggsdk.calibrate.engine_profile import save_profile
    from disaggsdk.sim.hardware import load_profile

    save_profile(attrs.evolve(load_profile("h100"), name="cpu-local", frontend_cpu_ms_per_token=0.1),
                 tmp_path / "profiles" / "cpu-local.yaml")
    monkeypatch.setenv("DISAGGSDK_HOME", str(tmp_path))
    nb = execute("should_i_disaggregate.ipynb")
    outs = outputs_of(nb)
    assert not [o for o in outs if o.output_type == "error"], [o for o in outs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outs if o.output_type == "stream")
    assert "chat turns (<= 512 prompt tokens)" in text and "edits (> 512)" in text
    assert "on this machine (measured): " in text and "qwen3-coder on h200 (simulated): " in text
    html = [o.data["text/html"] for o in outs if o.output_type == "execute_result" and "text/html" in o.data]
    table = next(h for h in html if "measured goodput req/s" in h)
    for layout in ("colocated", "P1:D1", "conditional P1:D1", "P2:D2"):
        assert f"<td>{layout}" in table
    assert "data:image/png;base64," in table  # the attainment and TTFT-TPOT plots
    assert "spans in one trace, across ['decode-0', 'prefill-0', 'router']" in text
    images = [o for o in outs if o.output_type in ("execute_result", "display_data") and "image/png" in o.data]
    assert images, "the waterfall did not render"
