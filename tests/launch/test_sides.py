"""launch's packages say which side of the process boundary their code runs on: `launch.unit_process`
inside a unit, `launch.launcher` in the process that starts and supervises the units, and
`disaggsdk.launch` itself what both share (the contract, the messages and their channel, the health
checks). The launcher reaches a unit's code only through its entry points; a unit never imports the
launcher's code, and the shared modules import neither side."""

from __future__ import annotations

from tests.conftest import ROOT
from tests.layering import read_imports

LAUNCH = "disaggsdk/launch/"
# the launcher starts a unit process by naming what it runs: `unit_main` (multiprocessing's spawn),
# `serve_unit` (a Ray node's unit process); the package's __init__ names the local runtime lazily
ENTRY_POINTS = {
    ("disaggsdk/launch/launcher/units.py", "disaggsdk.launch.unit_process.unit"),
    ("disaggsdk/launch/launcher/ray_unit_host.py", "disaggsdk.launch.unit_process.unit"),
    ("disaggsdk/launch/__init__.py", "disaggsdk.launch.launcher.supervisor"),
}


def side_of(where: str) -> str:
    """"unit_process", "launcher" or "shared" for a file path or module name under launch."""
    parts = where.replace("/", ".").split(".")
    return parts[2] if len(parts) > 3 and parts[2] in ("unit_process", "launcher") else "shared"


def test_no_side_imports_the_other_but_through_its_entry_points():
    crossings = [f"{imp.path}:{imp.line}: {imp.target_module}" for imp in read_imports(ROOT / "disaggsdk")
                 if imp.path.startswith(LAUNCH) and imp.target_module.startswith("disaggsdk.launch.")
                 and side_of(imp.target_module) not in ("shared", side_of(imp.path))
                 and (imp.path, imp.target_module) not in ENTRY_POINTS]
    assert not crossings, "\n".join(crossings)


def test_sides_are_read_from_the_path():
    assert side_of("disaggsdk/launch/unit_process/unit.py") == "unit_process"
    assert side_of("disaggsdk.launch.launcher.supervisor") == "launcher"
    assert side_of("disaggsdk/launch/health.py") == side_of("disaggsdk.launch.base") == "shared"
