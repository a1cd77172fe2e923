"""Spec files: YAML text <-> `Spec`, with errors that say where (file, line, YAML path)."""

from __future__ import annotations

from pathlib import Path

import yaml

from disaggsdk.errors import SpecError
from disaggsdk.spec.convert import spec_from_dict, spec_to_dict
from disaggsdk.spec.rules import check_spec
from disaggsdk.spec.types import Spec

# The smallest spec that runs here: one prefill and one decode process of a tiny model on a
# 2-core CPU, KV over shared memory (specs/tiny_pd.yaml spells out the rest).
CPU_STARTER_SPEC = """\
model: qwen3-coder-tiny
device: cpu
hardware: {gpu: cpu, gpus_per_node: 2}
kv: {dtype: float32}
transport: {provider: shm}
"""


def parse_spec_yaml(text: str, source: str | None = None) -> Spec:
    """Parse and fully validate a spec from YAML text.

    Args:
        text: the YAML document.
        source: the file it came from; when given, every message starts with it.
    Raises:
        SpecError: YAML syntax errors (with line and column), an empty document, and every
            type, value and cross-field problem (with its YAML path, after the file).
    """
    where = source or "<string>"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        marked = isinstance(exc, yaml.MarkedYAMLError)
        mark = exc.problem_mark if marked else None
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = (exc.problem if marked else None) or str(exc)
        raise SpecError(f"{at}: YAML syntax error: {problem}; fix the indentation or quoting") from None
    if data is None:
        lines = ", ".join(f"`{line}`" for line in CPU_STARTER_SPEC.splitlines())
        raise SpecError(
            f"{where}: the spec is empty; write at least {lines}, one per line: one prefill and "
            f"one decode process on this machine's CPU (specs/tiny_pd.yaml spells out the rest)"
        )
    try:
        return check_spec(spec_from_dict(data))
    except SpecError as exc:
        if source is None:
            raise
        raise SpecError([f"{source}: {problem}" for problem in exc.problems]) from None


def load_spec(path: str | Path) -> Spec:
    """Load and validate a spec file.

    Raises:
        SpecError: the file is missing or unreadable, or the spec is invalid (see `parse_spec_yaml`).
    """
    path = Path(path)
    if not path.is_file():
        hint = " (it is a directory)" if path.is_dir() else ""
        raise SpecError(f"{path}: spec file not found{hint}; pass the path of a YAML spec such as specs/tiny_local.yaml")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read the spec file: {exc}") from None
    return parse_spec_yaml(text, source=str(path))


def spec_to_yaml(spec: Spec) -> str:
    """YAML text that `parse_spec_yaml` turns back into an equal spec."""
    text: str = yaml.safe_dump(spec_to_dict(spec), sort_keys=False)  # with no stream, the YAML text
    return text


def save_spec(spec: Spec, path: str | Path) -> None:
    """Write ``spec`` as YAML to ``path``."""
    Path(path).write_text(spec_to_yaml(spec))
