"""Every import the notebooks make resolves with the installed extras: what `make test-latest` and
`make test-oldest` check of the notebooks at other dependency versions (executing them is the
default run's, tests/notebooks/test_notebooks.py)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def notebook_imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name or None) for each import statement in the notebook's code cells ("%" magics skipped)."""
    found: list[tuple[str, str | None]] = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                found += [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                found += [(node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.deps_smoke  # make test-latest / test-oldest (tools/deps_check.py)
@pytest.mark.parametrize("notebook", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")))
def test_every_import_of_a_notebook_resolves(notebook):
    imports = notebook_imports(NOTEBOOKS / notebook)
    assert imports, "a notebook that imports nothing is not one of ours"
    for module, name in imports:
        imported = importlib.import_module(module)
        if name is not None and name != "*":
            assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}"), f"{module}.{name}"
