"""A code corpus every machine has offline: the Python standard library sources of the running interpreter.

The tiny checkpoints are trained on it (tools/train_tiny) and benchmarks draw code prompts from its
held-out slice (`held_out_prompts`). The file list is fixed and sorted (tests,
idlelib and site-packages left out: tests are repetitive fixtures, idlelib a GUI); its SHA-256
manifest is saved with a checkpoint so that a run can be checked against the corpus it was trained
on. A deterministic held-out slice (every `HELD_OUT_EVERY`-th file) is never trained on.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HELD_OUT_EVERY = 20  # file i is held out when i % 20 == 0: ~5% of the files
SKIPPED_PARTS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"})


@dataclass(frozen=True)
class CorpusFile:
    """One source file of the corpus: its path relative to the stdlib root and its digest."""

    relative_path: str
    sha256: str
    size_bytes: int
    held_out: bool


def stdlib_root() -> Path:
    """The running interpreter's standard library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_files(root: Path | None = None) -> list[CorpusFile]:
    """The corpus files under ``root`` (default: the stdlib), sorted by relative path."""
    root = root or stdlib_root()
    paths = sorted(
        p for p in root.rglob("*.py")
        if p.is_file() and not SKIPPED_PARTS.intersection(p.relative_to(root).parts)
    )
    files = []
    for i, path in enumerate(paths):
        data = path.read_bytes()
        files.append(CorpusFile(path.relative_to(root).as_posix(), hashlib.sha256(data).hexdigest(), len(data),
                                held_out=i % HELD_OUT_EVERY == 0))
    return files


def manifest(files: list[CorpusFile]) -> dict:
    """The manifest saved beside a checkpoint: every file, its digest, and one digest over all."""
    whole = hashlib.sha256("".join(f"{f.relative_path}\0{f.sha256}\n" for f in files).encode()).hexdigest()
    return {
        "source": "python standard library",
        "files": [{"path": f.relative_path, "sha256": f.sha256, "bytes": f.size_bytes, "held_out": f.held_out}
                  for f in files],
        "sha256": whole,
    }


def write_manifest(files: list[CorpusFile], path: Path) -> None:
    """Save `manifest` as JSON."""
    path.write_text(json.dumps(manifest(files), indent=1) + "\n")


def texts(files: list[CorpusFile], held_out: bool, root: Path | None = None) -> Iterator[str]:
    """The text of the training files (``held_out`` False) or of the held-out ones (True).

    Raises:
        ValueError: a file changed since it was listed (its digest no longer matches).
    """
    root = root or stdlib_root()
    for f in files:
        if f.held_out != held_out:
            continue
        data = (root / f.relative_path).read_bytes()
        if hashlib.sha256(data).hexdigest() != f.sha256:
            raise ValueError(f"{f.relative_path} changed since the corpus was listed; list it again")
        yield data.decode("utf-8", errors="replace")


def _held_out_code(num_items: int, num_lines: int, root: Path | None) -> Iterator[list[str]]:
    """The lines from the first top-level ``def`` or ``class`` on, of the first ``num_items``
    held-out files that have at least ``num_lines`` of them."""
    found = 0
    for text in texts([f for f in list_files(root) if f.held_out], held_out=True, root=root):
        lines = text.splitlines(keepends=True)
        start = next((i for i, line in enumerate(lines) if line.startswith(("def ", "class "))), len(lines))
        if len(lines) - start >= num_lines:
            yield lines[start:]
            found += 1
        if found == num_items:
            return


def held_out_prompts(num_prompts: int, num_lines: int = 24, root: Path | None = None) -> list[str]:
    """``num_lines`` lines from the first top-level ``def`` or ``class`` of each of the first
    ``num_prompts`` held-out files that have that much code (code no tiny checkpoint was trained on)."""
    return ["".join(code[:num_lines]) for code in _held_out_code(num_prompts, num_lines, root)]


def held_out_windows(num_prompts: int, num_lines: int = 12, root: Path | None = None) -> list[str]:
    """``num_prompts`` prompts of ``num_lines`` lines of held-out code, for more prompts than there
    are held-out files: each file's code from its first top-level ``def`` or ``class`` is cut into
    consecutive windows, taken round-robin (every file's first window, then every second one, ...).
    Fewer come back only when the held-out code runs out."""
    windows = [[code[i : i + num_lines] for i in range(0, len(code) - num_lines + 1, num_lines)]
               for code in _held_out_code(-1, num_lines, root)]  # -1: every file (found never equals it)
    out = []
    for k in range(max(map(len, windows), default=0)):
        out += ["".join(w[k]) for w in windows if k < len(w)]
    return out[:num_prompts]


def held_out_sharegpt(num_prompts: int, num_lines: int = 24, root: Path | None = None) -> list[dict]:
    """`held_out_prompts` as a ShareGPT dataset (``disaggsdk bench --dataset``): each prompt is the
    human turn and the ``num_lines`` lines after it are the reference answer."""
    return [{"conversations": [{"from": "human", "value": "".join(code[:num_lines])},
                               {"from": "gpt", "value": "".join(code[num_lines : 2 * num_lines])}]}
            for code in _held_out_code(num_prompts, 2 * num_lines, root)]


def main(argv: list[str] | None = None) -> None:
    """``python -m disaggsdk.bench.code_corpus --sharegpt OUT``: write the held-out code dataset."""
    import argparse

    p = argparse.ArgumentParser(description="Write held-out code prompts as a ShareGPT JSON dataset.")
    p.add_argument("--sharegpt", required=True, metavar="OUT", help="the JSON file to write")
    p.add_argument("--num-prompts", type=int, default=26)
    p.add_argument("--num-lines", type=int, default=24, help="lines per prompt (and per reference answer)")
    a = p.parse_args(argv)
    Path(a.sharegpt).write_text(json.dumps(held_out_sharegpt(a.num_prompts, a.num_lines)))


if __name__ == "__main__":
    main()
