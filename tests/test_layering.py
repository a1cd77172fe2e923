"""The package graph is a DAG that follows the layers of tests/layering.py (docs/architecture.md)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.layering import LAYERS, package_cycles, read_imports, violations

PACKAGE = Path(__file__).resolve().parent.parent / "disaggsdk"


def test_every_import_follows_the_layers():
    bad = violations(read_imports(PACKAGE))
    assert not bad, "imports that break the layers of tests/layering.py:\n" + "\n".join(bad)


def test_the_package_graph_has_no_cycle():
    assert package_cycles(read_imports(PACKAGE)) == []


def test_the_testbed_uses_only_the_standard_library_and_the_errors():
    """The testbed runs where nothing but Python and iproute2 is installed (a bare test machine)."""
    import sys

    imports = [imp for imp in read_imports(PACKAGE) if imp.path.startswith("disaggsdk/testbed/")]
    assert imports
    for imp in imports:
        top = imp.target_module.split(".")[0]
        allowed = top in sys.stdlib_module_names or top == "__future__" \
            or imp.target_module.startswith(("disaggsdk.testbed", "disaggsdk.errors"))
        assert allowed, f"{imp.path}:{imp.line}: the testbed imports {imp.target_module}"


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - {"cli", "face"} <= set(LAYERS)


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "disaggsdk"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_an_upward_lazy_import_is_reported_with_file_and_line(tmp_path):
    root = _fake_package(tmp_path, {
        "__init__.py": "",
        "spec/__init__.py": "",
        "spec/cluster.py": "def plan():\n    from disaggsdk.serve.deployment import launch\n",
        "serve/__init__.py": "",
        "serve/deployment.py": "from disaggsdk.spec import cluster\n",
    })
    bad = violations(read_imports(root))
    assert bad == ["disaggsdk/spec/cluster.py:2: spec -> disaggsdk.serve.deployment "
                   "(imports upwards: serve is above spec)"]
    assert package_cycles(read_imports(root)) == [["serve", "spec", "serve"]]


def test_a_forbidden_downward_arrow_is_reported(tmp_path):
    root = _fake_package(tmp_path, {
        "__init__.py": "",
        "sim/__init__.py": "",
        "sim/calibrate.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from disaggsdk.engine import llm_engine\nimport torch\n",
        "engine/__init__.py": "",
        "engine/llm_engine.py": "",
    })
    bad = violations(read_imports(root))
    assert any(line.startswith("disaggsdk/sim/calibrate.py:3: sim -> disaggsdk.engine") for line in bad), bad
    assert any(line.startswith("disaggsdk/sim/calibrate.py:4: sim -> torch (the simulator is torch-free)")
               for line in bad), bad


def test_relative_imports_and_the_native_door(tmp_path):
    root = _fake_package(tmp_path, {
        "__init__.py": "",
        "messenger/__init__.py": "",
        "messenger/side.py": "from ..transfer import _fabric\nfrom . import other\n",
        "messenger/other.py": "",
        "transfer/__init__.py": "",
        "transfer/_fabric.py": "",
    })
    bad = violations(read_imports(root))
    assert bad == ["disaggsdk/messenger/side.py:1: messenger -> disaggsdk.transfer._fabric "
                   "(only disaggsdk.transfer imports the native module)"]
