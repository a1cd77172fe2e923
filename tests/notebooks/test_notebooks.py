"""The notebooks are part of the product: each one is executed top to bottom in a real kernel.

The quickstart is executed once per session (the `quickstart` fixture) as ``jupyter nbconvert --to html
--execute notebooks/quickstart.ipynb`` does it, with its defaults (widget state stored), and read twice:
for what its cells print and show, and exported to static HTML, as a reader without a kernel sees it,
in a real headless browser offline.
"""

import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbconvert import HTMLExporter
from nbconvert.preprocessors import ExecutePreprocessor

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
# git-ignored; CI can upload it: the exported HTML and the browser's screenshot of it
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"
DASHBOARD_HEADERS = ("TTFT p50 ms", "TTFT p99 ms", "tok/s/req", "KV used", "xfer GB/s")
INSTANCES = ("prefill-0", "decode-0", "decode-1")
# a unit's start-up lines (launch.progress): a launch in a notebook redraws one output instead
STARTUP_WORDS = ("loading weights", "compiling its step")


def execute(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def outputs_of(nb: nbformat.NotebookNode) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def shown_of(nb: nbformat.NotebookNode) -> list[dict]:
    """The mime bundles of the results and displays, in order."""
    return [o.data for o in outputs_of(nb) if o.output_type in ("execute_result", "display_data")]


def assert_no_startup_noise(nb: nbformat.NotebookNode) -> None:
    streams = [o for o in outputs_of(nb) if o.output_type == "stream"]
    assert not [o for o in streams if o.name == "stderr"], [o.text for o in streams if o.name == "stderr"]
    printed = "".join(o.text for o in streams) + "".join(d.get("text/plain", "") for d in shown_of(nb))
    assert not [w for w in STARTUP_WORDS if w in printed], printed


@pytest.fixture(scope="module")
def quickstart() -> nbformat.NotebookNode:
    # `--execute` is nbconvert's ExecutePreprocessor with its defaults, run before the export: widget
    # state is stored, so a widget in the notebook would make the export load a widget manager from unpkg.com
    nb = nbformat.read(NOTEBOOKS / "quickstart.ipynb", as_version=4)
    ExecutePreprocessor().preprocess(nb, {"metadata": {"path": str(NOTEBOOKS)}})
    return nb


def test_quickstart_runs_and_shows_the_plans_as_html(quickstart):
    outs = outputs_of(quickstart)
    assert not [o for o in outs if o.output_type == "error"]
    html = [o for o in outs if o.output_type == "execute_result" and "text/html" in o.data]
    assert len(html) >= 2  # the tp=8 plan and the tp=4 plan
    first_plan = html[0].data["text/html"]
    assert "decode-0" in first_plan and "does not fit" not in first_plan  # the first plan a newcomer sees fits
    text = "".join(o.get("text", "") for o in outs if o.output_type == "stream")
    assert "def fibonacci(n):\n    " in text  # the trained tiny model writes a function body


def test_quickstart_launch_says_ready_in_one_output_without_startup_lines(quickstart):
    assert_no_startup_noise(quickstart)
    launch_cell = next(c for c in quickstart.cells if c.cell_type == "code" and ".launch(" in c.source)
    (status,) = [o.data["text/plain"] for o in launch_cell.outputs if o.output_type == "display_data"]
    units_ready, endpoint_ready = status.splitlines()  # the last two lines, redrawn in place
    assert units_ready.startswith("ready: 3 units over shm") and "logs in " in units_ready
    assert endpoint_ready.startswith("ready in ") and "model qwen3-coder-tiny" in endpoint_ready


def test_quickstart_metrics_bench_and_dashboard_show_tables_not_dicts(quickstart):
    shown = shown_of(quickstart)
    metrics = next(d for d in shown if "requests served" in d.get("text/html", "")
                   and "disaggsdk-dashboard" not in d["text/html"])
    assert "<th>TTFT p50 ms</th>" in metrics["text/html"] and "None" not in metrics["text/html"]
    bench = next(d for d in shown if 'class="disaggsdk-bench"' in d.get("text/html", ""))
    assert "<td>completed</td><td>16</td>" in bench["text/html"] and "median_ttft_ms" in bench["text/plain"]
    dashboards = [d for d in shown if 'class="disaggsdk-dashboard"' in d.get("text/html", "")]
    assert len(dashboards) == 2  # at launch, and after the benchmark
    for d in dashboards:  # a static snapshot and a text table; no widget
        assert set(d) == {"text/html", "text/plain"} and "<svg" in d["text/html"]
        assert "decode-1" in d["text/plain"] and "VBox" not in d["text/plain"]
        # the benchmark's requests are on the plot: the first, shown before any request, was redrawn live
        assert "<circle" in d["text/html"]
    assert "widgets" not in quickstart.metadata  # nothing for nbconvert to render with a CDN's widget manager


def test_quickstart_exported_to_html_shows_the_dashboard_in_a_headless_browser_offline(quickstart, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed: `make sysdeps` installs it (Debian package chromium)")
    page, _ = HTMLExporter().from_notebook_node(quickstart)  # `jupyter nbconvert --to html`: its defaults
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
        table, plot = snapshot.split("</table>", 1)
        assert all(f"<th>{h}</th>" in table for h in DASHBOARD_HEADERS)
        assert all(f"<td>{name}</td>" in table for name in INSTANCES)
        assert plot.lstrip().startswith("<svg") and "<circle" in plot.split("</svg>")[0]
    assert png_path.stat().st_size > 10_000


@pytest.mark.slow  # 16 s on 2 cores; tests/sim covers the simulator it drives in the default run
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
    assert_no_startup_noise(nb)  # every launch of the comparison: its start-up lines go to the disaggsdk.launch logger
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
