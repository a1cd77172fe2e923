"""Count the lines of code of the package at a git revision: lines that hold code, not docstrings,
comments or blank lines.

    python -m tools.code_lines HEAD     # {"rev": "HEAD", "files": ..., "lines": ..., "code_lines": ...}

Reads the committed files under disaggsdk/ (``git show REV:PATH``), not the working tree, so two
revisions compare as committed. A docstring is the first statement of a module, class or function
when it is a string; every line a docstring spans is left out, and so is a line with only a
comment, punctuation of indentation or nothing on it.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import subprocess
import sys
import tokenize
from collections.abc import Sequence

PACKAGE = "disaggsdk"
NOT_CODE = frozenset({tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                      tokenize.ENCODING, tokenize.ENDMARKER})
HAS_DOCSTRING = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers (1-based) the docstrings of ``tree`` span."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, HAS_DOCSTRING) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def code_lines(source: str) -> int:
    """How many lines of Python ``source`` hold a token of code outside a docstring; 0 for source
    that does not tokenize or parse."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
        docstrings = docstring_lines(ast.parse(source))
    except (SyntaxError, tokenize.TokenError):
        return 0
    lines = {line for token in tokens if token.type not in NOT_CODE
             for line in range(token.start[0], token.end[0] + 1)}
    return len(lines - docstrings)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def count(rev: str, package: str = PACKAGE) -> dict[str, object]:
    """The counts of the ``.py`` files under ``package`` at ``rev``: files, lines and code lines.

    Raises:
        subprocess.CalledProcessError: ``rev`` is not a revision of the repository in the current directory.
    """
    paths = [p for p in _git("ls-tree", "-r", "--name-only", rev, package).split("\n") if p.endswith(".py")]
    sources = [_git("show", f"{rev}:{path}") for path in paths]
    return {"rev": rev, "files": len(paths), "lines": sum(s.count("\n") for s in sources),
            "code_lines": sum(code_lines(s) for s in sources)}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the counts of a revision as one JSON object. Returns the exit code."""
    parser = argparse.ArgumentParser(description="Count the package's lines of code at a git revision.")
    parser.add_argument("rev", nargs="?", default="HEAD", help="the revision (default: HEAD)")
    parser.add_argument("--package", default=PACKAGE, help=f"the folder counted (default: {PACKAGE})")
    args = parser.parse_args(argv)
    try:
        counts = count(args.rev, args.package)
    except subprocess.CalledProcessError as exc:
        print(f"error: git cannot read {args.rev!r}: {exc.stderr.strip()}", file=sys.stderr)
        return 2
    print(json.dumps(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
