"""cli.required_extras: a command whose pip extra is missing says so in one line and exits 2.

Fast: the missing module is simulated by wrapping ``importlib.util.find_spec``; the venvs that
really lack the extras are in test_wheel_extras.py.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from disaggsdk.cli import main as cli_main
from disaggsdk.cli import plan_cmd
from disaggsdk.cli.required_extras import (
    COMMAND_EXTRAS,
    EXTRA_MODULES,
    MODULE_EXTRAS,
    command_extras,
    extra_for_missing_module,
    install_hint,
    missing_extras,
)

REPO = Path(__file__).resolve().parents[2]
SPEC = str(REPO / "specs" / "tiny_local.yaml")

# pip name -> import name, where they differ by more than '-' for '_'
# the OpenTelemetry distributions all install into the one `opentelemetry` namespace package
IMPORT_NAME = {"cuda-python": "cuda", "flashinfer-python": "flashinfer", "pyyaml": "yaml",
               "opentelemetry-api": "opentelemetry", "opentelemetry-sdk": "opentelemetry",
               "opentelemetry-exporter-otlp-proto-http": "opentelemetry"}
# third-party imports no extra needs to bring, and why
NOT_IN_AN_EXTRA = {
    "transformers": "bench/engine_bench.make_checkpoint: a test and tools helper (the dev extra)",
    "IPython": "report/live_output.py: imported only inside a running Jupyter kernel, which brings it",
}


def _hide_modules(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    # find_spec answers None for `hidden` (as if not installed) and looks up everything else
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        return None if name.split(".")[0] in hidden else real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def _requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        name = requirement.split(";")[0]
        for stop in "[<>=!~ ":
            name = name.split(stop)[0]
        name = name.strip().lower()
        names.add(IMPORT_NAME.get(name, name.replace("-", "_")))
    return names


def test_a_missing_extra_is_one_line_and_exit_2(monkeypatch, capsys):
    _hide_modules(monkeypatch, "torch")
    assert cli_main.main(["generate", "--model", "qwen3-coder-tiny", "--prompt", "hi"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: disaggsdk generate needs the engine extra: pip install 'disaggsdk[engine]'\n"


def test_transfer_bench_without_cffi_names_the_extra_not_libfabric(monkeypatch, capsys):
    _hide_modules(monkeypatch, "cffi")
    assert cli_main.main(["transfer-bench"]) == 2
    err = capsys.readouterr().err
    assert err == "error: disaggsdk transfer-bench needs the transfer extra: pip install 'disaggsdk[transfer]'\n"


def test_only_the_missing_extras_are_named(monkeypatch, capsys):
    _hide_modules(monkeypatch, "torch", "httpx")  # transfer present, engine and serve missing
    assert cli_main.main(["launch", SPEC, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: disaggsdk launch needs the engine and serve extras: "
                   "pip install 'disaggsdk[engine,serve]'\n")


def test_core_commands_run_without_any_extra(monkeypatch, capsys):
    _hide_modules(monkeypatch, *MODULE_EXTRAS)
    assert cli_main.main(["validate", SPEC]) == 0
    assert cli_main.main(["plan", SPEC]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_an_import_escaping_a_command_becomes_the_same_line(monkeypatch, capsys):
    def run_needing_ray(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    monkeypatch.setattr(plan_cmd, "run", run_needing_ray)
    assert cli_main.main(["plan", SPEC]) == 2
    assert capsys.readouterr().err == "error: disaggsdk plan needs the ray extra: pip install 'disaggsdk[ray]'\n"


def test_an_import_no_extra_provides_keeps_its_traceback(monkeypatch):
    def run_with_a_typo(args: argparse.Namespace) -> int:
        raise ModuleNotFoundError("No module named 'disaggsdk.nowhere'", name="disaggsdk.nowhere")

    monkeypatch.setattr(plan_cmd, "run", run_with_a_typo)
    with pytest.raises(ModuleNotFoundError):
        cli_main.main(["plan", SPEC])


def test_help_needs_no_extra(monkeypatch, capsys):
    _hide_modules(monkeypatch, *MODULE_EXTRAS)
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main(["launch", "--help"])
    assert exit_info.value.code == 0
    assert "usage: disaggsdk launch" in capsys.readouterr().out


def test_options_that_launch_a_deployment_need_its_extras():
    parser = cli_main.build_parser()
    assert command_extras("bench", parser.parse_args(["bench", "http://127.0.0.1:8000"])) == ("serve",)
    assert command_extras("bench", parser.parse_args(["bench", SPEC])) == ("engine", "transfer", "serve")
    # one command may sweep a spec and a server: the spec launches a deployment
    assert command_extras("bench", parser.parse_args(["bench", "http://127.0.0.1:8000", SPEC])) == (
        "engine", "transfer", "serve")
    assert command_extras("generate", parser.parse_args(["generate", "--model", "m"])) == ("engine",)
    assert command_extras("generate", parser.parse_args(["generate", "--spec", SPEC])) == ("engine", "transfer", "serve")
    assert command_extras("simulate", parser.parse_args(["simulate", SPEC])) == ()
    assert command_extras("simulate", parser.parse_args(["simulate", SPEC, "--validate"])) == ("engine", "transfer", "serve")
    assert command_extras("calibrate", parser.parse_args(["calibrate"])) == ("engine",)
    assert command_extras("plan") == ()


def test_missing_extras_looks_modules_up(monkeypatch):
    assert missing_extras(("engine",)) == ()  # the development venv has every extra
    _hide_modules(monkeypatch, "numpy")
    assert missing_extras(("engine", "serve")) == ("engine",)


def test_a_module_maps_to_the_commands_own_extra():
    assert extra_for_missing_module("msgspec", ("transfer",)) == "transfer"
    assert extra_for_missing_module("msgspec", ("engine", "transfer")) == "engine"
    assert extra_for_missing_module("starlette.routing") == "serve"
    assert extra_for_missing_module("_cffi_backend") == "transfer"
    assert extra_for_missing_module("yaml") is None  # core: its absence is a broken install, not an extra
    assert extra_for_missing_module(None) is None


def test_install_hint_lists_extras_for_pip():
    assert install_hint("serve", ("engine", "serve")) == \
        "disaggsdk serve needs the engine and serve extras: pip install 'disaggsdk[engine,serve]'"
    assert install_hint("launch", ("engine", "transfer", "serve")) == \
        "disaggsdk launch needs the engine, transfer and serve extras: pip install 'disaggsdk[engine,transfer,serve]'"


def test_tables_agree_with_pyproject_and_the_cli():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = {name: reqs for name, reqs in project["optional-dependencies"].items() if name != "dev"}
    assert set(extras) == set(EXTRA_MODULES)
    for extra, requirements in extras.items():
        assert _requirement_names(requirements) == set(EXTRA_MODULES[extra]), extra
    assert set(COMMAND_EXTRAS) <= set(cli_main.COMMANDS)


def _runtime_imports(path: Path) -> set[str]:
    # top-level third-party modules a file imports, leaving out `if TYPE_CHECKING:` blocks
    tree = ast.parse(path.read_text())
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and ast.unparse(block.test).endswith("TYPE_CHECKING") for child in block.body
                 for node in ast.walk(child)}
    names = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"disaggsdk", "__future__"}


def test_every_import_of_the_package_is_in_the_core_or_an_extra():
    core = _requirement_names(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    core |= {"cattrs", "attr"}  # attrs installs `attr` and `attrs`
    unowned = {}
    for path in sorted((REPO / "disaggsdk").rglob("*.py")):
        for module in _runtime_imports(path) - core - set(MODULE_EXTRAS) - set(NOT_IN_AN_EXTRA):
            unowned.setdefault(module, str(path.relative_to(REPO)))
    assert unowned == {}, "add these to an extra in pyproject.toml and cli/required_extras.py"


def test_the_cli_starts_without_heavy_imports():
    code = ("import sys\nfrom disaggsdk.cli.main import build_parser\nbuild_parser()\n"
            f"print(sorted(m for m in {sorted(MODULE_EXTRAS)!r} if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_transport_without_cffi_names_the_transfer_extra():
    # the Python API's door to the native module (no CLI check in front): cffi absent is an extra to
    # install, not libfabric to rebuild
    code = (
        "import sys; sys.modules['_cffi_backend'] = None\n"
        "from disaggsdk.transfer import TransferEngine, NativeLibraryMissing\n"
        "try:\n    TransferEngine('shm')\nexcept NativeLibraryMissing as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'disaggsdk[transfer]'" in out.stdout and "libfabric-dev" not in out.stdout
