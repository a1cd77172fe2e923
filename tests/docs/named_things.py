"""What README.md, docs/ and the package's docstrings and comments name, and whether it exists.

Prose goes stale when code moves: a docstring keeps pointing at `launch.unit_reach` after the
module was renamed, a page keeps showing a flag the parser no longer has. This module reads the
names such text spells and checks each against the code itself, not against a list:

* module names: ``disaggsdk.x.y`` anywhere, and in code spans the names that start with a package
  of disaggsdk (``launch.health``, ``engine.layer_counter.host.LayerCounter``; in a docstring also one
  that starts with a sibling module and names a class, ``cuda_vmm.CudaSharedAllocation``), and the
  module of every ``python -m``. A name resolves when its leading parts are packages and modules
  (files under disaggsdk/, from the package root or from the package of the file that names it)
  and the rest are attributes the module defines (read from its AST, nothing is imported): a
  top-level definition, an import, an ``__all__`` entry, then a class's members.
* spec keys: a code span that starts with ``$.`` (``$.kv.dtype``) or whose first part is a section
  of the spec (``engine.compile``, ``serve.autoscale``, ``decode.ep: 8``, ``spec.serve.port``) must
  be a key path of the spec classes (`disaggsdk.spec.reference.spec_sections`), or else a module name that resolves (the
  sections ``engine``, ``launch``, ``serve``, ``transfer`` are also packages).
* repository paths: a code span or a command's word with a ``/`` whose first part is a top-level
  entry of the repository or a package of disaggsdk (``tools/gpu_check.sh``,
  ``engine/compiled_step/cuda_graphs.py``, ``specs/*.yaml``) must match a file or folder, from the root, from
  disaggsdk/ or from the naming file's folder.
* commands: a line of a code span or block that runs ``disaggsdk CMD ...`` must name a command of
  the real parser (`disaggsdk.cli.main.build_parser`), and each ``--flag`` must be one that command
  (or the testbed action) accepts.

Names that start with anything else (``torch.compile``, ``self.pages``, ``config.json``) are not
read: they are not ours to check, and guessing at them would give false alarms.
"""

from __future__ import annotations

import argparse
import ast
import functools
import io
import re
import shlex
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

PACKAGE_DIR = ROOT / "disaggsdk"
PACKAGE = "disaggsdk"

FENCED_CODE = re.compile(r"^ {0,3}(```|~~~)[^\n]*\n(.*?)^ {0,3}\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
# `disaggsdk.x.y` in any text: not after a word, dot, slash or dash (a URL, `pkg/disaggsdk.py`)
PACKAGE_NAME = re.compile(r"(?<![\w./-])disaggsdk(?:\.[A-Za-z_]\w*)+")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
# a dotted span that is a file name (`spec.schema.json`, `config.json`), not a module
FILE_SUFFIX = re.compile(r"\.(?:json|jsonl|md|py|pyi|yaml|yml|sh|c|h|txt|toml|ipynb|pt|safetensors|so|html|svg|png|csv"
                         r"|log|jinja)$")
# `decode.ep: 8`, `kv.dtype: fp8`: a spec key with its value
KEY_WITH_VALUE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+):\s")
PYTHON_MODULE = re.compile(r"(?:^|\s)(?:\S*/)?python3?\s+-m\s+([\w.]+)")
PATH_WORD = re.compile(r"^(?:\.\./)*[\w.*-]+(?:/[\w.*{},-]+)+/?$")
COMMAND_START = re.compile(r"^(?:\$\s+)?(?:\S*/)?disaggsdk\s+(.*)$")
# where a command's own words end on a line: a pipe, a chain, a redirect, a comment
COMMAND_END = re.compile(r"\s(?:\||&&|;|>|2>|#).*$")
# what a module's attribute path may end in and still be read as a name: `f()`, `Cls.method()`
CALL_SUFFIX = re.compile(r"\(\)$")


@dataclass(frozen=True)
class Mention:
    """One name some text spells: where, and as written."""

    source: Path  # the file that names it
    line: int  # 1-based
    kind: str  # "module", "spec key", "path", "command"
    name: str

    def where(self) -> str:
        return f"{self.source.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Snippet:
    """Text of a file that may name things: a code span, a code block, a docstring or a comment."""

    line: int
    text: str
    is_code: bool  # a code span or block (names are read from it); else prose (only `disaggsdk.x` is)


# reading text


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def markdown_snippets(text: str) -> list[Snippet]:
    """The code blocks and code spans of a Markdown text, and its prose, each with its first line."""
    snippets = []
    prose_parts = []
    last = 0
    for block in FENCED_CODE.finditer(text):
        prose_parts.append((last, text[last:block.start()]))
        snippets.append(Snippet(_line_of(text, block.start(2)), block.group(2), is_code=True))
        last = block.end()
    prose_parts.append((last, text[last:]))
    for start, prose in prose_parts:
        snippets.append(Snippet(_line_of(text, start), prose, is_code=False))
        for span in CODE_SPAN.finditer(prose):
            snippets.append(Snippet(_line_of(text, start + span.start(2)), span.group(2), is_code=True))
    return snippets


def python_snippets(source: str) -> list[Snippet]:
    """The docstrings (and other bare string statements) and comments of a Python source, and their
    code spans (single or double backticks)."""
    texts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            texts.append((node.lineno, node.value.value))
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            texts.append((token.start[0], token.string))
    snippets = []
    for line, text in texts:
        snippets.append(Snippet(line, text, is_code=False))
        for span in CODE_SPAN.finditer(text):
            snippets.append(Snippet(line + text.count("\n", 0, span.start(2)), span.group(2), is_code=True))
    return snippets


# modules


@functools.cache
def _module_tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _names_bound(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body binds at its own level (inside if/try blocks too)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
                if isinstance(target, ast.Name) and target.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                    names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str))
        elif isinstance(node, (ast.If, ast.Try)):
            inner = list(node.body) + list(getattr(node, "orelse", []))
            for handler in getattr(node, "handlers", []):
                inner += handler.body
            names |= _names_bound(inner + list(getattr(node, "finalbody", [])))
    return names


def _class_members(node: ast.ClassDef) -> set[str]:
    """A class's members: its body's names, and what its methods assign to ``self.x``."""
    names = _names_bound(node.body)
    for item in ast.walk(node):
        if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store) and isinstance(item.value, ast.Name) \
                and item.value.id == "self":
            names.add(item.attr)
    return names


def _attribute_problem(module: Path, attributes: list[str]) -> str | None:
    """Why ``attributes`` (``["Cls", "method"]``) is not defined in ``module``, or None."""
    if not attributes:
        return None
    tree = _module_tree(module)
    first, rest = attributes[0], attributes[1:]
    if first not in _names_bound(tree.body):
        return f"{module.relative_to(ROOT)} defines no {first!r}"
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    node = classes.get(first)
    for name in rest:
        if node is None or node.bases:  # an import, a variable, a subclass: its members are not read here
            return None
        if name not in _class_members(node):
            return f"{module.relative_to(ROOT)}: {node.name} has no {name!r}"
        node = next((n for n in node.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    return None


def _entry(folder: Path, name: str) -> Path | None:
    """The package folder or module file ``name`` in ``folder``, or None."""
    if (folder / name).is_dir():
        return folder / name
    if (folder / f"{name}.py").is_file():
        return folder / f"{name}.py"
    return None


def module_problem(parts: list[str], base: Path) -> str | None:
    """Why ``parts`` (``["launch", "health", "SilenceWatch"]``) names nothing under ``base``, a
    package folder, or None when its leading parts are packages and modules and the rest attributes."""
    here = _entry(base, parts[0])
    if here is None:
        if base == PACKAGE_DIR and _attribute_problem(base / "__init__.py", parts) is None:
            return None  # `disaggsdk.__version__`, `disaggsdk.Cluster`
        return f"no module {parts[0]!r} in {base.relative_to(ROOT)}/"
    for i, name in enumerate(parts[1:], 1):
        if here.is_file():
            return _attribute_problem(here, parts[i:])
        found = _entry(here, name)
        if found is None:
            init = here / "__init__.py"
            if not init.is_file():
                return f"no module {name!r} in {here.relative_to(ROOT)}/"
            problem = _attribute_problem(init, parts[i:])
            return None if problem is None else f"no module {name!r} in {here.relative_to(ROOT)}/ ({problem})"
        here = found
    return None


def package_bases(source: Path) -> list[Path]:
    """The package folders a name in ``source`` may be relative to: disaggsdk/ itself, and for a file
    of the package the folders from its own up to disaggsdk/."""
    bases = [PACKAGE_DIR]
    if source.is_relative_to(PACKAGE_DIR):
        folder = source.parent
        while folder != PACKAGE_DIR:
            bases.append(folder)
            folder = folder.parent
    return bases


def _first_part_is_package(first: str, bases: list[Path]) -> bool:
    return any((base / first).is_dir() for base in bases)


def _first_part_is_module_naming_a_class(parts: list[str], bases: list[Path]) -> bool:
    # `cuda_vmm.CudaSharedAllocation`, `messages.Heartbeat`: a sibling module and a class; a lower-case
    # second part (`state.num_computed_tokens`) is as likely a variable's attribute as a module's
    return len(parts) > 1 and parts[1][:1].isupper() and any((base / f"{parts[0]}.py").is_file() for base in bases)


@functools.cache
def names_the_code_spells() -> frozenset[str]:
    """The ``disaggsdk.x`` strings of the package's code and build scripts: span and attribute names
    (``disaggsdk.request``), logger names (``disaggsdk.access``), the built extension
    (``disaggsdk.transfer._fabric``). A text naming one names something that exists."""
    sources = [*package_sources(), ROOT / "setup.py", *sorted((ROOT / "native").glob("*.py"))]
    return frozenset(node.value for path in sources for node in ast.walk(_module_tree(path))
                     if isinstance(node, ast.Constant) and isinstance(node.value, str)
                     and PACKAGE_NAME.fullmatch(node.value))


def resolve_module(parts: list[str], bases: list[Path]) -> str | None:
    """Why the dotted name ``parts`` resolves under none of ``bases``, or None when one holds it."""
    if parts[0] == PACKAGE:
        if ".".join(parts) in names_the_code_spells():
            return None
        return module_problem(parts[1:], PACKAGE_DIR) if len(parts) > 1 else None
    problems = [module_problem(parts, base) for base in bases]
    return None if None in problems else problems[0]


# spec keys


@functools.cache
def spec_key_paths() -> frozenset[str]:
    """Every key path of the spec, without the ``$.``: ``engine.compile``, ``serve.autoscale``..."""
    from disaggsdk.spec.reference import spec_sections

    return frozenset(key.path.removeprefix("$.") for section in spec_sections() for key in section.keys)


@functools.cache
def spec_top_level_keys() -> frozenset[str]:
    """The spec's top-level keys: ``model``, ``device``, ``engine``, ``serve``..."""
    return frozenset(path for path in spec_key_paths() if "." not in path)


@functools.cache
def spec_sections_names() -> frozenset[str]:
    """The spec's top-level keys that hold a mapping: ``engine``, ``serve``, ``transport``..."""
    return frozenset(path.split(".")[0] for path in spec_key_paths() if "." in path)


# paths


@functools.cache
def _top_level_entries() -> frozenset[str]:
    return frozenset(p.name for p in ROOT.iterdir() if not p.name.startswith("."))


def path_problem(word: str, source: Path) -> str | None:
    """Why ``word`` (``tools/gpu_check.sh``, ``engine/compiled_step/cuda_graphs.py``, ``specs/*.yaml``) matches
    no file or folder from the repository root, from disaggsdk/ or from ``source``'s folder; None when
    one does, or when ``word`` is not a repository path at all."""
    word = word.rstrip("/").rstrip(".,:;")
    first = word.split("/")[0]
    if first not in _top_level_entries() and not (PACKAGE_DIR / first).is_dir() and first != "..":
        return None
    for base in (ROOT, PACKAGE_DIR, source.parent):
        if any(c in word for c in "*{"):
            if any(base.glob(_brace_free(word))):
                return None
        elif (base / word).exists():
            return None
    if word.endswith(".so") and _extension_module(word) in names_the_code_spells():
        return None  # a native extension the build makes (`_fabric*.so`): absent from a clean checkout
    return "no such file or folder in the repository"


def _extension_module(word: str) -> str:
    """The module a native extension's file name stands for: ``disaggsdk.transfer._fabric`` of
    ``disaggsdk/transfer/_fabric*.so`` or of ``transfer/_fabric.cpython-311-x86_64-linux-gnu.so``."""
    stem = re.sub(r"(?:\*|\.[\w-]+)?\.so$", "", word)
    name = stem.replace("/", ".")
    return name if name.startswith(f"{PACKAGE}.") else f"{PACKAGE}.{name}"


def _brace_free(pattern: str) -> str:
    # `native/{a,b}.c` reads as a glob of either; pathlib's glob has no braces
    return re.sub(r"\{[^}]*\}", "*", pattern)


# commands


def _command_words(line: str) -> list[str] | None:
    """The words after ``disaggsdk`` in a line that runs it, or None when the line does not."""
    match = COMMAND_START.match(line.strip())
    if match is None:
        return None
    rest = COMMAND_END.sub("", " " + match.group(1)).strip()
    try:
        return shlex.split(rest)
    except ValueError:  # an unbalanced quote in an abbreviated example
        return rest.split()


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return set(parser._option_string_actions)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flag_of(word: str) -> str | None:
    """The option a command word spells (``--port`` of ``[--port=0]``), or None for a value."""
    word = word.strip("[](){},")
    if not word.startswith("-") or word in ("-", "--") or re.match(r"^-\d", word):
        return None
    return word.split("=", 1)[0]


def command_problem(words: list[str], parser: argparse.ArgumentParser) -> str | None:
    """Why ``disaggsdk WORDS`` names a command or flag the parser lacks, or None.

    Placeholders (``COMMAND``, ``<cmd>``, ``...``) are not checked; flags are checked against the
    command's parser (and a testbed action's), values are not parsed.
    """
    from disaggsdk.cli.version_info import VERBOSE_FLAGS, wants_verbose_version

    commands = _subcommands(parser)
    command_parser = parser
    verbose_version = wants_verbose_version(words)  # `--version -v`: cli.main reads it before argparse
    for word in words:
        flag = _flag_of(word)
        if flag is not None:
            if flag not in _option_strings(command_parser) and not (verbose_version and flag in VERBOSE_FLAGS):
                where = "disaggsdk" if command_parser is parser else command_parser.prog
                return f"{where} has no option {flag}"
            continue
        if command_parser is parser:  # the first word that is not an option names the command
            if re.fullmatch(r"[a-z][a-z-]*", word) is None:
                return None  # a placeholder: COMMAND, <cmd>, ...
            if word not in commands:
                return f"no command {word!r} (commands: {', '.join(commands)})"
            command_parser = commands[word]
            commands = _subcommands(command_parser)
        elif word in commands:  # testbed ACTION
            command_parser = commands[word]
            commands = {}
    return None


@functools.cache
def cli_parser() -> argparse.ArgumentParser:
    from disaggsdk.cli.main import build_parser

    return build_parser()


# what a snippet names


def _dotted_candidates(text: str) -> list[str]:
    """The dotted names of a code span: the whole span (a trailing ``()`` and ``: value`` dropped)."""
    text = text.strip()
    keyed = KEY_WITH_VALUE.match(text)
    if keyed:
        return [keyed.group(1)]
    text = CALL_SUFFIX.sub("", text)
    return [text] if DOTTED.match(text) and not FILE_SUFFIX.search(text) else []


def snippet_mentions(snippet: Snippet, source: Path) -> list[Mention]:
    """The names in ``snippet`` that this checker reads (see the module docstring)."""
    found = [Mention(source, snippet.line + snippet.text.count("\n", 0, m.start()), "module", m.group(0))
             for m in PACKAGE_NAME.finditer(snippet.text)]
    if not snippet.is_code:
        return found
    bases = package_bases(source)
    for offset, line in _logical_lines(snippet.text):
        number = snippet.line + offset
        if _command_words(line) is not None:
            found.append(Mention(source, number, "command", line.strip()))
        for module in PYTHON_MODULE.findall(line):
            if module.split(".")[0] in ("tools", "tests"):
                found.append(Mention(source, number, "module", module))
        for word in re.split(r"[\s=]+", line):
            word = word.strip("`'\"()[],;")
            if "/" in word and "://" not in word and not word.startswith(("/", "~")) and PATH_WORD.match(word):
                found.append(Mention(source, number, "path", word))
    for name in _dotted_candidates(snippet.text.strip().removeprefix("$.")):
        if snippet.text.strip().startswith("$."):  # `$.kv.dtype`, `$.decode`: a spec key and nothing else
            found.append(Mention(source, snippet.line, "spec key", f"spec.{name}"))
            continue
        parts = name.split(".")
        if parts[0] == PACKAGE:
            continue  # read above, from any text
        if parts[0] in spec_sections_names() or (parts[0] == "spec" and parts[1] in spec_top_level_keys()):
            found.append(Mention(source, snippet.line, "spec key", name))
        elif _first_part_is_package(parts[0], bases) or _first_part_is_module_naming_a_class(parts, bases):
            found.append(Mention(source, snippet.line, "module", name))
    return found


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines of a code block, a trailing backslash joining a line to the next."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        start, line = i, lines[i]
        while line.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line.rstrip()[:-1] + " " + lines[i]
        yield start, line
        i += 1


def mention_problem(mention: Mention) -> str | None:
    """Why ``mention`` names nothing that exists, or None."""
    if mention.kind == "command":
        words = _command_words(mention.name)
        return command_problem(words or [], cli_parser())
    if mention.kind == "path":
        return path_problem(mention.name, mention.source)
    parts = mention.name.split(".")
    if mention.kind == "spec key":
        key = mention.name.removeprefix("spec.")
        if key in spec_key_paths():
            return None
        module = None if parts[0] == "spec" else resolve_module(parts, package_bases(mention.source))
        if parts[0] != "spec" and module is None:
            return None  # `engine.compiled_step.cuda_graphs`: the section's name is also a package
        return "neither a spec key nor a module" + (f" ({module})" if module else "")
    if parts[0] in ("tools", "tests"):  # python -m tools.x: a module of the repository
        return None if module_problem(parts, ROOT) is None else f"no module {mention.name} in the repository"
    return resolve_module(parts, package_bases(mention.source))


# the files read


def markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def package_sources() -> list[Path]:
    return sorted(p for p in PACKAGE_DIR.rglob("*.py") if "__pycache__" not in p.parts)


def mentions_in(path: Path) -> list[Mention]:
    """Every name ``path`` (a Markdown page or a Python source) spells that this checker reads."""
    text = path.read_text(encoding="utf-8")
    snippets = python_snippets(text) if path.suffix == ".py" else markdown_snippets(text)
    return [m for s in snippets for m in snippet_mentions(s, path)]


def dangling(paths: list[Path]) -> list[str]:
    """One line per name in ``paths`` that names nothing: where, what, why."""
    out = []
    for path in paths:
        seen = set()
        for mention in mentions_in(path):
            if (mention.kind, mention.name, mention.line) in seen:
                continue
            seen.add((mention.kind, mention.name, mention.line))
            problem = mention_problem(mention)
            if problem:
                out.append(f"{mention.where()}: {mention.kind} `{mention.name}`: {problem}")
    return out
