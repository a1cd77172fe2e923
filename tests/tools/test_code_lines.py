"""The code-line counter (`python -m tools.code_lines`): docstrings, comments and blank lines are not code."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from tools.code_lines import code_lines, count


def test_a_docstring_only_module_has_no_code():
    assert code_lines('"""A module.\n\nIt says what it is.\n"""\n') == 0


def test_a_function_counts_its_lines_but_not_its_docstring_comments_or_blanks():
    source = ('"""Module."""\n'
              "\n"
              "# a comment\n"
              "def add(a, b):\n"
              '    """Add two numbers.\n'
              "\n"
              '    Returns: their sum."""\n'
              "    total = (a +\n"
              "             b)  # wrapped\n"
              "\n"
              "    return total\n")
    assert code_lines(source) == 4  # def, the two lines of the sum, return


def test_a_string_that_is_not_a_docstring_is_code():
    assert code_lines('x = 1\n"""not a docstring: the module\'s first statement is x"""\n') == 2


def test_source_that_does_not_parse_counts_nothing():
    assert code_lines("def broken(:\n    pass\n") == 0


def test_the_command_prints_the_counts_of_a_revision_as_json(monkeypatch):
    monkeypatch.chdir(ROOT)  # `count` asks git in the current directory
    out = subprocess.run([sys.executable, "-m", "tools.code_lines", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    counts = json.loads(out)
    assert counts == count("HEAD") and counts["rev"] == "HEAD"
    assert 0 < counts["code_lines"] < counts["lines"] and counts["files"] > 0


def test_an_unknown_revision_is_one_line_and_exit_code_2():
    done = subprocess.run([sys.executable, "-m", "tools.code_lines", "no-such-revision"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: git cannot read 'no-such-revision'")
