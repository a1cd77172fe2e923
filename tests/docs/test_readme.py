"""README fits a screen and the repository stands alone (issue 38, item 2).

README.md stays under 8 KB; every Markdown link in README.md and docs/ names a file of this
repository (docs/ pages only files under docs/, which is what the site carries); and no file of the
repository names a path of the `shared/` folder that sits beside the checkout on the development
machines, since a clean clone has no such folder.

Links to the web (http, https, mailto) are refused in README.md (it must read offline and stay
short) and allowed in docs/ pages, whose site builds without fetching them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

README_MAX_BYTES = 8192
WEB_SCHEMES = ("http://", "https://", "mailto:")
# [text](target "title") and ![alt](target); reference definitions "[label]: target"
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE)
FENCED_CODE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`+[^`]*`+")
# a path into the folder beside the checkout: `../shared/x`, `shared/DESIGN.md` (not `x/shared/`,
# `cache_shared/`); this file spells such paths to test the pattern and is left out of the scan
SHARED_PATH = re.compile(r"(?<![\w./-])(?:\.\./)*shared/[\w.-]+")


def markdown_links(text: str) -> list[str]:
    """The link targets of a Markdown text, code blocks and inline code left out."""
    prose = INLINE_CODE.sub("", FENCED_CODE.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_DEFINITION.findall(prose)


def link_problem(page: Path, target: str, root: Path, allow_web: bool) -> str | None:
    """Why ``target`` (a link on ``page``) does not resolve to a file of the repository, or None."""
    if target.startswith(WEB_SCHEMES):
        return None if allow_web else "a link to the web (README links only files of the repository)"
    if "://" in target or target.startswith("/"):
        return "an absolute link"
    path = target.split("#", 1)[0].split("?", 1)[0]
    if not path:  # an anchor on the same page
        return None
    resolved = (page.parent / path).resolve()
    if not resolved.is_relative_to(root):
        return "a link outside the repository"
    if not resolved.is_file():
        return "no such file in the repository"
    docs = root / "docs"
    if page.is_relative_to(docs) and not resolved.is_relative_to(docs):
        return "a docs page linking outside docs/ (the site carries only docs/)"
    return None


def repository_files(root: Path) -> list[Path]:
    """The files of the repository: tracked, and new ones git does not ignore."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                                cwd=root, capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e}): the repository's files cannot be listed")
    return [root / name for name in listed.decode().split("\0") if name and (root / name).is_file()]


def markdown_pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def test_readme_fits_a_screen():
    size = (ROOT / "README.md").stat().st_size
    assert size < README_MAX_BYTES, f"README.md is {size} bytes; move detail into docs/ (limit {README_MAX_BYTES})"


def test_every_link_in_readme_and_docs_names_a_file_of_the_repository():
    root = ROOT.resolve()
    problems = []
    for page in markdown_pages(root):
        allow_web = page.name != "README.md" or page.parent != root
        for target in markdown_links(page.read_text(encoding="utf-8")):
            problem = link_problem(page, target, root, allow_web)
            if problem:
                problems.append(f"{page.relative_to(root)}: ({target}) is {problem}")
    assert not problems, "\n".join(problems)


def test_readme_links_the_docs_it_names():
    links = markdown_links((ROOT / "README.md").read_text(encoding="utf-8"))
    for page in ("docs/install.md", "docs/performance.md", "docs/hardware.md", "docs/tour.md"):
        assert page in links, f"README.md should link {page}"


def test_no_file_of_the_repository_names_the_shared_folder_beside_it():
    root = ROOT.resolve()
    found = []
    for path in repository_files(root):
        if path == Path(__file__).resolve():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary: checkpoints, images
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            found += [f"{path.relative_to(root)}:{number}: {m}" for m in SHARED_PATH.findall(line)]
    assert not found, "these name files outside the repository (bring them into docs/ or tools/):\n" + "\n".join(found)


@pytest.mark.parametrize(("target", "allow_web", "problem"), [
    ("../shared/DESIGN.md", True, "a link outside the repository"),
    ("docs/nowhere.md", False, "no such file in the repository"),
    ("https://example.org", False, "a link to the web (README links only files of the repository)"),
    ("https://example.org", True, None),
    ("docs/tour.md#a-tour", False, None),
    ("#install", False, None),
    ("/etc/passwd", False, "an absolute link"),
])
def test_link_problem_names_what_is_wrong(target, allow_web, problem):
    root = ROOT.resolve()
    assert link_problem(root / "README.md", target, root, allow_web) == problem


def test_a_docs_page_may_not_link_outside_docs():
    root = ROOT.resolve()
    problem = link_problem(root / "docs" / "tour.md", "../Makefile", root, allow_web=True)
    assert problem == "a docs page linking outside docs/ (the site carries only docs/)"


def test_markdown_links_skip_code_and_find_references():
    text = "see [a](x.md) and ![img](i.png)\n\n```\n[b](in_code.md)\n```\n`[c](inline.md)`\n[ref]: y.md\n"
    assert sorted(markdown_links(text)) == ["i.png", "x.md", "y.md"]


def test_the_shared_folder_pattern():
    assert SHARED_PATH.findall("see ../shared/peers/vllm/x.sh and shared/FACTS.md") == ["../shared/peers", "shared/FACTS.md"]
    assert SHARED_PATH.findall("disaggsdk/memory/shared/x and cache_shared/y") == []
