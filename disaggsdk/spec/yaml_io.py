"""Spec files: YAML text <-> `Spec`, with errors that say where (file, line, YAML path)."""

from __future__ import annotations

from pathlib import Path

import yaml

from disaggsdk.errors import SpecError, printable
from disaggsdk.spec.convert import spec_from_dict, spec_to_dict
from disaggsdk.spec.rules import check_spec
from disaggsdk.spec.types import Spec
from disaggsdk.spec.yaml_loader import YamlRefused, load_yaml

# A spec file is a few KB (the shipped ones at most 1.2 KB); far more is not a spec, and is not read.
MAX_SPEC_BYTES = 1 << 20

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
        SpecError: YAML syntax errors (with line and column), a text past the bounds of
            `spec.yaml_loader` (aliases, nodes, depth, a key twice, `MAX_SPEC_BYTES`), an empty
            document, and every type, value and cross-field problem (with its YAML path, after the
            file). Each problem is one line.
    """
    where = source or "<string>"
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(f"{where}: {len(text):,} characters is not a spec (one is a few KB; at most "
                        f"{MAX_SPEC_BYTES:,} are read)")
    try:
        data = load_yaml(text)
    except YamlRefused as exc:
        raise SpecError(f"{where}:{exc.mark.line + 1}:{exc.mark.column + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        marked = isinstance(exc, yaml.MarkedYAMLError)
        mark = exc.problem_mark if marked else None
        at = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark else where
        problem = " ".join(((exc.problem if marked else None) or str(exc)).split())  # one line
        raise SpecError(f"{at}: YAML syntax error: {problem}; fix the indentation or quoting") from None
    if data is None:
        lines = ", ".join(f"`{line}`" for line in CPU_STARTER_SPEC.splitlines())
        raise SpecError(f"{where}: the spec is empty; write at least {lines}, one per line: one prefill and "
                        f"one decode process on this machine's CPU (specs/tiny_pd.yaml spells out the rest)")
    try:
        return check_spec(spec_from_dict(data))
    except SpecError as exc:
        if source is None:
            raise
        raise SpecError([f"{source}: {problem}" for problem in exc.problems]) from None


def load_spec(path: str | Path) -> Spec:
    """Load and validate a spec file.

    Raises:
        SpecError: the file is missing, unreadable or larger than `MAX_SPEC_BYTES`, or the spec is
            invalid (see `parse_spec_yaml`).
    """
    path = Path(path)
    where = printable(str(path))
    try:
        if not path.is_file():
            hint = " (it is a directory)" if path.is_dir() else ""
            raise SpecError(f"{where}: spec file not found{hint}; pass the path of a YAML spec such as "
                            "specs/tiny_local.yaml")
        with path.open("rb") as file:
            data = file.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:  # a name too long, a folder it may not enter, an I/O error
        raise SpecError(f"{where}: cannot read the spec file: {exc.strerror or exc}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"{where}: more than {MAX_SPEC_BYTES:,} bytes is not a spec (one is a few KB)")
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise SpecError(f"{where}: cannot read the spec file: it is not UTF-8 text ({exc.reason} at byte "
                        f"{exc.start})") from None
    return parse_spec_yaml(text, source=where)


def spec_to_yaml(spec: Spec) -> str:
    """YAML text that `parse_spec_yaml` turns back into an equal spec."""
    text: str = yaml.safe_dump(spec_to_dict(spec), sort_keys=False)  # with no stream, the YAML text
    return text


def save_spec(spec: Spec, path: str | Path) -> None:
    """Write ``spec`` as YAML to ``path``."""
    Path(path).write_text(spec_to_yaml(spec))
