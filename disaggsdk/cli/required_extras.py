"""Which pip extra each command needs, checked before it runs, so a missing one is one line and exit 2."""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Mapping

# extra -> the top-level modules its distributions install (the import names, not the pip names)
EXTRA_MODULES: Mapping[str, tuple[str, ...]] = {
    "engine": ("torch", "safetensors", "tokenizers", "llguidance", "numpy", "msgspec", "cffi"),
    "transfer": ("cffi", "msgspec"),
    "serve": ("fastapi", "uvicorn", "prometheus_client", "httpx", "jinja2", "redis"),
    "gpu": ("cuda", "flashinfer"),
    "notebook": ("matplotlib", "pandas"),
    "ray": ("ray",),
    "trace": ("opentelemetry",),  # api, sdk and the OTLP exporter share one namespace package
    "kernels": ("aiconfigurator_core",),  # measured GPU kernel tables (sim/kernel_db.py finds them, never imports it)
}

# module -> the extra that provides it: the modules above (one two extras bring maps to the first:
# msgspec -> engine, so the walk is backwards), and those their distributions bring along that our
# code imports by name (an import of these fails only when the extra is missing)
MODULE_EXTRAS: Mapping[str, str] = {
    **{module: extra for extra, modules in list(EXTRA_MODULES.items())[::-1] for module in modules},
    "_cffi_backend": "transfer",  # cffi's compiled half: what a cffi-built module imports first
    "starlette": "serve",  # fastapi's base
    "h11": "serve",  # uvicorn's HTTP/1.1 parser (serve/http/http_limits.py sets its limits)
    "pyarrow": "kernels",  # aiconfigurator-core's dependency that reads its parquet tables (sim/kernel_db.py)
}

# the extras a command needs however it is called; commands not listed run on the core
COMMAND_EXTRAS: Mapping[str, tuple[str, ...]] = {
    "generate": ("engine",),
    "serve": ("engine", "serve"),
    "launch": ("engine", "transfer", "serve"),
    "bench": ("serve",),  # the load client; a SPEC target launches a deployment as well
    "drain": ("serve",),  # httpx, to call the deployment's control endpoint
    "move": ("serve",),
    "rebalance": ("serve",),
    "transfer-bench": ("transfer",),
    "kv-bench": ("engine", "transfer"),
    "calibrate": ("engine",),
    "compare": ("engine", "transfer", "serve", "notebook"),  # launches each layout; notebook: its plots
}

# starting a deployment (prefill and decode processes, KV over libfabric, the OpenAI server)
DEPLOYMENT_EXTRAS = ("engine", "transfer", "serve")


def _starts_deployment(command: str, args: argparse.Namespace) -> bool:
    # the options with which a command that otherwise needs less launches a spec's processes
    if command == "bench":
        targets = getattr(args, "targets", None) or []
        return any(not str(target).startswith(("http://", "https://")) for target in targets)
    if command == "generate":
        return bool(getattr(args, "spec", None))
    if command == "testbed":
        return getattr(args, "testbed_action", None) == "bench"
    if command == "simulate":
        return bool(getattr(args, "validate", False))
    if command == "calibrate":
        return bool(getattr(args, "deployment", None))
    return False


def command_extras(command: str, args: argparse.Namespace | None = None) -> tuple[str, ...]:
    """The extras ``disaggsdk COMMAND`` needs when called with ``args``.

    Args:
        command: the sub-command's name (``"generate"``, ``"transfer-bench"``).
        args: its parsed arguments; options that launch a deployment (``bench SPEC``,
            ``generate --spec``, ``simulate --validate``, ``calibrate --deployment``, ``testbed
            bench``) add the deployment's extras; ``testbed up --ray`` and ``testbed bench`` add
            ray. None: the extras of the command's plainest call.

    Returns:
        The extras' names in pyproject.toml order, empty for a core command.
    """
    needed = set(COMMAND_EXTRAS.get(command, ()))
    if args is not None and _starts_deployment(command, args):
        needed.update(DEPLOYMENT_EXTRAS)
    if command == "testbed" and args is not None and (getattr(args, "ray", False)
                                                      or getattr(args, "testbed_action", None) == "bench"):
        needed.add("ray")  # `testbed up --ray` runs `ray start` in every node; `bench` too
    return tuple(extra for extra in EXTRA_MODULES if extra in needed)


def missing_extras(extras: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``extras`` with a module that cannot be found (looked up, not imported)."""
    return tuple(extra for extra in extras
                 if any(importlib.util.find_spec(module) is None for module in EXTRA_MODULES[extra]))


def extra_for_missing_module(module_name: str | None, command_extras: tuple[str, ...] = ()) -> str | None:
    """The extra that installs ``module_name`` (a ModuleNotFoundError's ``name``), or None if none does.

    Args:
        module_name: the module that was not found, dotted or not (``"numpy.linalg"``).
        command_extras: the extras of the command that failed; where two extras bring the module
            (msgspec: engine and transfer) the command's own is named.
    """
    if not module_name:
        return None
    top = module_name.split(".")[0]
    return next((extra for extra in command_extras if top in EXTRA_MODULES[extra]), MODULE_EXTRAS.get(top))


def install_hint(command: str, extras: tuple[str, ...]) -> str:
    """The one line that says which extras ``disaggsdk COMMAND`` needs and how to install them.

    >>> install_hint("generate", ("engine",))
    "disaggsdk generate needs the engine extra: pip install 'disaggsdk[engine]'"
    """
    names = extras[0] if len(extras) == 1 else ", ".join(extras[:-1]) + " and " + extras[-1]
    noun = "extra" if len(extras) == 1 else "extras"
    return f"disaggsdk {command} needs the {names} {noun}: pip install 'disaggsdk[{','.join(extras)}]'"
