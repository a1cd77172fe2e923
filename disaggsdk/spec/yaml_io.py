"""Spec files: YAML text <-> `Spec`, with errors that say where (file, line, YAML path)."""

from __future__ import annotations

from pathlib import Path

import yaml

from disaggsdk.errors import SpecError
from disaggsdk.spec.convert import spec_from_dict, spec_to_dict
from disaggsdk.spec.rules import check_spec
from disaggsdk.spec.types import Spec


def parse_spec_yaml(text: str, source: str = "<string>") -> Spec:
    """Parse and fully validate a spec from YAML text.

    Args:
        text: the YAML document.
        source: where it came from, used in messages.
    Raises:
        SpecError: YAML syntax errors (with line and column), an empty document, and every
            type, value and cross-field problem (with its YAML path).
    """
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError(f"{where}: YAML syntax error: {problem}; fix the indentation or quoting") from None
    if data is None:
        raise SpecError(
            f"{source}: the spec is empty; write at least `model: qwen3-coder-tiny` "
            f"(see specs/tiny_local.yaml)"
        )
    spec = spec_from_dict(data)
    return check_spec(spec)


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
    return yaml.safe_dump(spec_to_dict(spec), sort_keys=False)


def save_spec(spec: Spec, path: str | Path) -> None:
    """Write ``spec`` as YAML to ``path``."""
    Path(path).write_text(spec_to_yaml(spec))
