"""The rules the prose of the code keeps, one test each.

* A module docstring says what the module is in at most `MAX_MODULE_DOCSTRING_LINES` lines; how it
  came to be and what went wrong before go to docs/.
* disaggsdk/ and tools/ name no issue or item of the tracker (``issue 33``, ``item 4``): the text
  must read on its own. docs/status.md and the docs pages may name them; tests/ may too, where a
  test holds the acceptance of the issue it names.
* No file of disaggsdk/, tests/ or tools/ names a file of the folder beside the checkout (DESIGN.md,
  STYLE.md, LESSONS.md, FACTS.md): a clean clone has none. Paths into that folder are
  tests/docs/test_readme.py's to refuse.
* A code span in a docstring, comment or message that is a key path of the spec is written
  ``$.section.key``, as errors spell it; spans that are also a module path (``serve.autoscale``,
  ``launch.cuda_devices``) are ambiguous and left alone.
* disaggsdk/, tests/ and tools/ import a name from the module that defines it, not from a module that
  imports it in turn. A package's ``__init__.py`` that lists the name in ``__all__`` (``disaggsdk``,
  ``disaggsdk.spec``, ``disaggsdk.plan``...) is a public surface and may be imported from.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

from tests.conftest import ROOT
from tests.docs.named_things import CODE_SPAN, resolve_module, spec_key_paths

PACKAGE_DIR = ROOT / "disaggsdk"
MAX_MODULE_DOCSTRING_LINES = 8

NOT_YET: frozenset[str] = frozenset()  # files a rule does not hold yet: none

ISSUE_REFERENCE = re.compile(r"\b(?:issues?\s+#?\d+|item\s+\d+|finding\s+\d+)", re.IGNORECASE)
OUTSIDE_FILE = re.compile(r"\b(?:DESIGN|STYLE|LESSONS|FACTS)\.md\b|\bSTYLE rule\b")


def sources(*folders: str) -> list[Path]:
    return [path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))
            if path.relative_to(ROOT).as_posix() not in NOT_YET]


def lines_matching(pattern: re.Pattern[str], paths: list[Path]) -> list[str]:
    found = []
    for path in paths:
        if path == Path(__file__).resolve():
            continue  # spells the patterns
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{number}: {m.group(0)}" for m in pattern.finditer(line)]
    return found


def test_module_docstrings_say_what_the_module_is_in_a_few_lines():
    long = []
    for path in sources("disaggsdk"):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        if doc and len(doc.splitlines()) > MAX_MODULE_DOCSTRING_LINES:
            long.append(f"{path.relative_to(ROOT)}: {len(doc.splitlines())} lines")
    assert not long, (f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines (say what the module is; "
                      "history and failure stories go to docs/):\n" + "\n".join(long))


def test_the_code_names_no_issue_of_the_tracker():
    found = lines_matching(ISSUE_REFERENCE, sources("disaggsdk", "tools"))
    assert not found, "say what the text means instead of naming the issue:\n" + "\n".join(found)


def test_the_code_names_no_file_outside_the_repository():
    # test_readme.py spells those files to test its own pattern
    found = lines_matching(OUTSIDE_FILE, [p for p in sources("disaggsdk", "tests", "tools") if p.name != "test_readme.py"])
    assert not found, "these name files a clean clone lacks (bring the point into the text or docs/):\n" + "\n".join(found)


def texts_of(source: str) -> list[tuple[int, str]]:
    """The string constants (docstrings, messages, f-string parts) and comments of a source."""
    texts = [(node.lineno, node.value) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    texts += [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
              if token.type == tokenize.COMMENT]
    return texts


@functools.cache
def bare_spec_keys() -> frozenset[str]:
    """The key paths of the spec with a dot (``kv.dtype``) that name no module of disaggsdk."""
    return frozenset(key for key in spec_key_paths()
                     if "." in key and resolve_module(key.split("."), [PACKAGE_DIR]) is not None)


def test_spec_keys_are_written_with_their_root():
    found = []
    for path in sources("disaggsdk"):
        for line, text in texts_of(path.read_text(encoding="utf-8")):
            for span in CODE_SPAN.finditer(text):
                key = span.group(2).strip().split(":")[0]
                if key in bare_spec_keys():
                    found.append(f"{path.relative_to(ROOT)}:{line}: {span.group(0)} (write `$.{key}`)")
    assert not found, "spec keys are spelled as errors spell them:\n" + "\n".join(found)


def _module_file(module: str) -> Path | None:
    path = ROOT / module.replace(".", "/")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


@functools.cache
def _bindings(path: Path) -> tuple[frozenset[str], dict[str, str], frozenset[str]]:
    """What a module binds at its top level: names it defines, names it imports (name -> module),
    and its ``__all__``."""
    defined: set[str] = set()
    imported: dict[str, str] = {}
    exported: set[str] = set()

    def read(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}
                defined.update(names)
                if "__all__" in names and isinstance(node.value, (ast.List, ast.Tuple)):
                    exported.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.update({alias.asname or alias.name: node.module for alias in node.names})
            elif isinstance(node, (ast.If, ast.Try)):
                inner = [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
                read(inner + [s for handler in getattr(node, "handlers", []) for s in handler.body])

    read(ast.parse(path.read_text(encoding="utf-8")).body)
    return frozenset(defined), imported, frozenset(exported)


def reexported_import(module: str, name: str) -> str | None:
    """The module that defines ``name`` when ``module`` only passes it on, or None."""
    path = _module_file(module)
    if path is None or _module_file(f"{module}.{name}") is not None:
        return None
    defined, imported, exported = _bindings(path)
    if name in defined or not imported.get(name, "").startswith("disaggsdk"):
        return None
    if path.name == "__init__.py" and name in exported:
        return None  # a package's public surface
    return imported[name]


def test_names_are_imported_from_the_module_that_defines_them():
    found = []
    for path in sources("disaggsdk", "tests", "tools"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("disaggsdk"):
                for alias in node.names:
                    home = reexported_import(node.module, alias.name)
                    if home:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {alias.name} from {node.module} "
                                     f"(defined in {home})")
    assert not found, "import these from where they are defined:\n" + "\n".join(found)


def test_the_reexport_check_knows_a_passed_on_name_from_a_public_surface():
    assert reexported_import("disaggsdk.engine.sampling", "SamplingParams") == "disaggsdk.engine.sampling_params"
    assert reexported_import("disaggsdk.engine.sampling_params", "SamplingParams") is None
    assert reexported_import("disaggsdk.spec", "Spec") is None
