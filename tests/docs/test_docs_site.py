"""The docs site builds from docs/ with warnings as errors (issue 38, item 2).

`mkdocs build --strict` fails on a page the nav names that does not exist, a link to a missing page
or anchor, and a docstring the API pages (mkdocstrings) cannot read, so `make test` catches a doc
that went stale with the code. mkdocs comes with the `dev` extra that `make test` installs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("mkdocs", reason="the docs site needs mkdocs (pip install -e '.[dev]')")
pytest.importorskip("mkdocstrings_handlers.python", reason="the API pages need mkdocstrings[python] (the dev extra)")


def build_site(site_dir, config="mkdocs.yml"):
    """`mkdocs build --strict` of the repository's site into ``site_dir``."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / config),
                           "--site-dir", str(site_dir)], cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_the_docs_site_builds_with_warnings_as_errors(tmp_path):
    site = tmp_path / "site"
    built = build_site(site)
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr[-4000:]}"
    # the API reference is generated from the docstrings: Cluster's methods are on its page
    api = (site / "api" / "face" / "index.html").read_text(encoding="utf-8")
    for name in ("Cluster", "prefill", "decoders", "launch", "Deployment", "generate", "shutdown"):
        assert name in api, f"the API page lacks {name}"
    for page in ("index.html", "performance/index.html", "hardware/index.html", "install/index.html"):
        assert (site / page).is_file(), page


def test_a_broken_link_fails_the_strict_build(tmp_path):
    """The build is strict: a page linking a missing one makes it fail (so the check above can fail)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text("site_name: broken\ndocs_dir: docs\nstrict: true\n", encoding="utf-8")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                            "--site-dir", str(tmp_path / "site")], capture_output=True, text=True, timeout=120)
    assert built.returncode != 0
    assert "missing.md" in built.stderr
