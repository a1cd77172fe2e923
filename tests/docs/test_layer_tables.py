"""The layer tables of the docs list the layers of tests/layering.py in its order (issue 57, item 4).

`tests/layering.py` is the one table of layers the import test holds the code to; docs/architecture.md
("Layers, bottom to top") and docs/layout.md (the package table) each show it to a reader. A layer
added, removed or moved there and not in a doc (or the other way round) fails here.
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT
from tests.layering import LAYERS

# the first path of disaggsdk a row names: `disaggsdk/spec/`, `disaggsdk/errors.py`, `disaggsdk/__init__.py`
PACKAGE_PATH = re.compile(r"`disaggsdk/(\w+)(?:/|\.py)`")


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each body row of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def layer_of_path_cell(cell: str) -> str:
    """The layer a package cell names by its first disaggsdk path (`cli/`, `face/`, `__init__.py`: the face)."""
    match = PACKAGE_PATH.search(cell)
    assert match, f"no disaggsdk path in the table cell {cell!r}"
    name = match.group(1)
    return "face" if name in ("cli", "face", "__init__") else name


def architecture_layers() -> list[str]:
    rows = table_rows((ROOT / "docs" / "architecture.md").read_text(), "| layer | package |")
    for layer, package, *_ in rows:
        assert layer_of_path_cell(package) == layer, f"docs/architecture.md: layer {layer!r} names {package}"
    return [row[0] for row in rows]


def layout_layers() -> list[str]:
    rows = table_rows((ROOT / "docs" / "layout.md").read_text(), "| package | what it owns |")
    return [layer_of_path_cell(row[0]) for row in rows]


@pytest.mark.parametrize("read", [architecture_layers, layout_layers], ids=["architecture.md", "layout.md"])
def test_a_docs_layer_table_lists_the_layers_in_the_order_of_tests_layering(read):
    assert read() == list(LAYERS)

