"""Every module of the GPU path imports against the installed GPU libraries (CPU, no GPU needed), and
every import statement in it resolves, the lazy ones inside functions included (those under
``if TYPE_CHECKING:`` are mypy's to resolve: they may name what exists for the checker only).

The GPU modules are found, not listed: each module of the package whose source uses FlashInfer,
cuda-python, ``torch.cuda`` or NCCL / ``torch.distributed``.
"""

from __future__ import annotations

import ast
import importlib
import re
import warnings
from pathlib import Path

import pytest

from tests.conftest import ROOT

# a library's name, or a module of the package that calls one (the cuMem pool, a CUDA tensor view)
GPU_API = re.compile(r"flashinfer|cuda\.bindings|torch\.cuda|nccl|torch\.distributed|cuda_vmm|cuda_array", re.IGNORECASE)
# the GPU modules issue 54 names: the scan must find at least these
NAMED = {
    "disaggsdk.engine.attention.flashinfer_backend", "disaggsdk.kv.pools.cuda_vmm", "disaggsdk.engine.compiled_step.cuda_graphs",
    "disaggsdk.engine.layer_counter.device", "disaggsdk.engine.fp8_linear", "disaggsdk.engine.tp_group",
    "disaggsdk.kv.pools", "disaggsdk.kv.pools.host_mirror", "disaggsdk.engine.expert_parallel.all_to_all",
    "disaggsdk.engine.dp_lockstep", "disaggsdk.engine.parallel", "disaggsdk.engine.model_runner",
    "disaggsdk.launch.kv_registration", "disaggsdk.kv.pools.cuda_array",
}


def gpu_modules() -> list[str]:
    """The package's modules whose source uses a GPU library."""
    found = []
    for path in sorted((ROOT / "disaggsdk").rglob("*.py")):
        if GPU_API.search(path.read_text()):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def imported_names(module: str, path: Path) -> list[tuple[str, str | None]]:
    """(module, name or None) of every import statement in ``path`` that runs, wherever it stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and ast.unparse(block.test).endswith("TYPE_CHECKING") for child in block.body for node in ast.walk(child)}
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.extend((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = importlib.util.resolve_name("." * node.level + (node.module or ""), package) if node.level \
                else node.module or ""
            found.extend((base, alias.name) for alias in node.names)
    return found


def test_the_scan_finds_the_gpu_modules():
    assert NAMED <= set(gpu_modules()), NAMED - set(gpu_modules())


@pytest.mark.parametrize("module", gpu_modules())
def test_a_gpu_module_and_its_imports_resolve(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # FlashInfer's own imports of names CUTLASS renamed
        loaded = importlib.import_module(module)
        unresolved = []
        for target, name in imported_names(module, Path(loaded.__file__ or "")):
            imported = importlib.import_module(target)
            if name is not None and not hasattr(imported, name):
                try:
                    importlib.import_module(f"{target}.{name}")
                except ImportError:
                    unresolved.append(f"from {target} import {name}")
    assert unresolved == []
