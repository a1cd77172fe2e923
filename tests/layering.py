"""The package layers of disaggsdk and the arrows between them: the one table the layering test reads.

Bottom to top; the layer tables of docs/architecture.md and docs/layout.md list the same packages in
this order, and tests/docs/test_layer_tables.py holds them to it. A package may import any package
below it, lazy imports and `TYPE_CHECKING` imports included; never one above it; and never one of
the FORBIDDEN arrows, even downwards. ``errors`` is `disaggsdk/errors.py`, the typed exceptions
every layer raises. ``models`` sits below ``spec``: the spec's semantic rules check tp sizes
against the model's head counts, and architecture facts import nothing of the spec. ``records``
sits below ``kv``: the engine and the messenger count into its records (`UnitCounters`,
`RequestTransfer`, `RequestSpanRecords`), which units send and /metrics reads unchanged. ``report``
(accounting and views that only render) sits above ``messenger`` and below ``sim``, which
summarizes its simulated timelines with report's accounting. ``testbed`` sits just above
``errors``: it drives iproute2 and imports nothing else of disaggsdk, so any layer (bench,
calibrate, the face) may build the many-node testbed it measures on.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

LAYERS: tuple[str, ...] = (
    "errors",     # disaggsdk/errors.py
    "testbed",    # nodes in namespaces joined by shaped links (standard library + iproute2 only)
    "models",     # architecture facts: catalog + HF config.json
    "spec",       # frozen attrs classes, YAML, validation (data only)
    "plan",       # pure planning: instances, placement, sharding, routes
    "records",    # measured records that cross a process: the one declaration of the counters, transfers, spans
    "kv",         # KV pages: allocator, block hashes, prefix cache, layout; rank pools (host/CUDA twins), the hand-over
    "transfer",   # fabric-lib: endpoints, registrations, paged writes, immediates
    "engine",     # the torch LLM engine
    "messenger",  # the KV handoff, prefill side and decode side
    "report",     # pure accounting of timelines; views that only render
    "sim",        # the cluster simulator (torch-free)
    "launch",     # the Runtime seam: units of a plan as local processes
    "serve",      # router over a Runtime, OpenAI HTTP front end, metrics
    "bench",      # load generators and benchmarks
    "calibrate",  # fitting profiles, validating the simulator against real runs
    "face",       # disaggsdk/__init__.py, cli/, face/ (Cluster, Deployment)
)

# (from, to, why): arrows the architecture forbids even though they point downwards. ``to`` may be a
# third-party top-level module as well as a layer.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("engine", "transfer", "the engine knows no network: the messenger drives it through its hooks"),
    ("engine", "messenger", "the engine knows no network: the messenger drives it through its hooks"),
    ("sim", "engine", "the simulator is torch-free: it uses plan and report, never the engine"),
    ("sim", "torch", "the simulator is torch-free"),
    ("records", "torch", "a record is plain data that crosses a process"),
    ("records", "fastapi", "records know no HTTP"),
    ("records", "httpx", "records know no HTTP"),
    ("records", "uvicorn", "records know no HTTP"),
    ("report", "fastapi", "report knows no HTTP"),
    ("report", "httpx", "report knows no HTTP"),
    ("report", "uvicorn", "report knows no HTTP"),
    ("spec", "torch", "a spec is data"),
    ("plan", "torch", "planning is pure"),
)

# the single door to native code: only the transfer layer imports the cffi module
NATIVE_MODULE = "disaggsdk.transfer._fabric"


@dataclass(frozen=True)
class Import:
    """One import statement of a disaggsdk file."""

    path: str  # relative to the repository root
    line: int
    source_layer: str
    target_module: str  # the absolute module name imported


def layer_of(module: str) -> str | None:
    """The layer of an absolute module name, or None for a module outside disaggsdk."""
    parts = module.split(".")
    if parts[0] != "disaggsdk":
        return None
    if len(parts) == 1 or parts[1] in ("cli", "face", "__init__", "__main__"):
        return "face"
    return parts[1]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def read_imports(package_dir: Path) -> list[Import]:
    """Every import in every .py file under ``package_dir`` (eager, lazy and TYPE_CHECKING ones).

    ``from disaggsdk import x`` is read as an import of ``disaggsdk.x`` where ``x`` is a module.
    """
    root = package_dir.parent
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        module = _module_name(path, root)
        source_layer = layer_of(module)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node, module, path.name == "__init__.py")
                targets = [base]
                for alias in node.names:  # `from disaggsdk import spec` names a module
                    candidate = f"{base}.{alias.name}"
                    pkg = root / Path(*candidate.split("."))
                    if pkg.is_dir() or pkg.with_suffix(".py").exists():
                        targets.append(candidate)
            else:
                continue
            for target in targets:
                found.append(Import(str(path.relative_to(root)), node.lineno, source_layer, target))
    return found


def violations(imports: list[Import]) -> list[str]:
    """One line per import that breaks the layers: ``file:line: a -> b (why)``."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    forbidden = {(a, b): why for a, b, why in FORBIDDEN}
    out = []
    for imp in imports:
        src = imp.source_layer
        if src not in rank:
            out.append(f"{imp.path}:{imp.line}: package {src!r} is not in tests/layering.py LAYERS; add it")
            continue
        target_layer = layer_of(imp.target_module)
        top = imp.target_module.split(".")[0]
        where = f"{imp.path}:{imp.line}: {src} -> {imp.target_module}"
        if (src, top) in forbidden:
            out.append(f"{where} ({forbidden[(src, top)]})")
        if target_layer is None or target_layer == src:
            continue
        if target_layer not in rank:
            out.append(f"{where}: package {target_layer!r} is not in tests/layering.py LAYERS; add it")
        elif rank[target_layer] > rank[src]:
            out.append(f"{where} (imports upwards: {target_layer} is above {src})")
        elif (src, target_layer) in forbidden:
            out.append(f"{where} ({forbidden[(src, target_layer)]})")
        if imp.target_module.startswith(NATIVE_MODULE) and src != "transfer":
            out.append(f"{where} (only disaggsdk.transfer imports the native module)")
    return out


def package_cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles in the package graph (each as a list of layers), empty when it is a DAG."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        target = layer_of(imp.target_module)
        if target and target != imp.source_layer:
            graph.setdefault(imp.source_layer, set()).add(target)
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles
