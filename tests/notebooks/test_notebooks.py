"""The notebooks are part of the product: each one is executed top to bottom in a real kernel."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def execute(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    return nb


def outputs_of(nb: nbformat.NotebookNode) -> list[dict]:
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def test_quickstart_runs_and_shows_the_plans_as_html():
    nb = execute("quickstart.ipynb")
    outs = outputs_of(nb)
    assert not [o for o in outs if o.output_type == "error"]
    html = [o for o in outs if o.output_type == "execute_result" and "text/html" in o.data]
    assert len(html) >= 2  # the tp=8 plan and the tp=4 plan
    assert "decode-0" in html[0].data["text/html"]
    text = "".join(o.get("text", "") for o in outs if o.output_type == "stream")
    assert "def fibonacci(n):\n    " in text  # the trained tiny model writes a function body


@pytest.mark.slow  # 27 s; the quickstart notebook is the default run's executed notebook
def test_simulate_notebook_compares_layouts_and_names_its_disagreements():
    nb = execute("simulate.ipynb")
    outs = outputs_of(nb)
    assert not [o for o in outs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outs if o.output_type == "stream")
    assert "best:" in text and "1P:3D > 90 tok/s at ~1 QPS/decode node (MTP)" in text
    assert sum(1 for o in outs if o.output_type == "display_data" and "image/png" in o.data) == 2
