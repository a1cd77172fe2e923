"""docs/cli.md is what `disaggsdk.cli.reference` writes from the parsers `disaggsdk` runs, so it cannot
drift from the CLI: a flag added, renamed or re-documented fails this test until the page is written
again (``python -m disaggsdk.cli.reference --write``)."""

from __future__ import annotations

import argparse

from disaggsdk.cli import reference
from disaggsdk.cli.main import build_parser
from disaggsdk.cli.options import HelpFormatter, add_hidden_alias
from tests.conftest import ROOT


def test_the_committed_page_is_what_the_generator_writes():
    committed = (ROOT / reference.PAGE).read_text(encoding="utf-8")
    assert committed == reference.render_markdown(), f"docs/cli.md is stale: run `{reference.REGENERATE}`"


def test_every_command_and_every_shown_flag_is_on_the_page():
    page = reference.render_markdown()
    for prog, parser, _help in reference.commands(build_parser()):
        assert f"\n## {prog}\n" in page, prog
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            for flag in action.option_strings:
                assert flag in page, f"{prog} {flag}"


def test_the_page_is_the_same_whatever_the_terminal_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = reference.render_markdown()
    monkeypatch.setenv("COLUMNS", "300")
    assert reference.render_markdown() == narrow


def test_the_top_level_help_says_what_version_v_prints():
    text = build_parser().format_help()
    assert "--version -v" in text and "kernels" in text


def small_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tool", description="A tool.", formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="Run it.", formatter_class=HelpFormatter)
    run.add_argument("specs", nargs="+", metavar="SPEC", help="spec files")
    run.add_argument("--tp", type=int, default=2, help="ranks")
    run.add_argument("--level", choices=("low", "high"), default="low", help="how much")
    run.add_argument("-o", "--output", metavar="FILE", help="where (default: stdout)")
    run.add_argument("--rate", default="inf", metavar="R|list", help="requests/s")
    add_hidden_alias(run, "--old-tp", dest="tp", type=int)
    loads = run.add_argument_group("load")
    loads.add_argument("--num-prompts", type=int, default=8, help="prompts")
    return parser


def test_a_command_is_rendered_with_its_arguments_defaults_and_groups():
    page = reference.render_markdown(small_parser())
    assert "| [`tool run`](#tool-run) | Run it. |" in page
    section = page[page.index("## tool run"):]
    assert "`tool run [options] SPEC [SPEC ...]`" in section
    assert "| `SPEC [SPEC ...]` | spec files |" in section
    assert "| `--tp TP` | ranks (default: 2) |" in section
    assert "| `--level {low,high}` | how much (default: low) |" in section
    assert "| `-o, --output FILE` | where (default: stdout) |" in section  # the help says it: not twice
    assert "| `--rate R\\|list` | requests/s (default: inf) |" in section  # a | inside a cell is escaped
    assert "*load*\n\n| argument | what it does |\n|---|---|\n| `--num-prompts NUM_PROMPTS` | prompts (default: 8) |" in section
    assert "--old-tp" not in page and "-h, --help" not in page


def test_write_puts_the_page_under_the_root(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    assert reference.main(["--write", "--root", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / "cli.md").read_text(encoding="utf-8") == reference.render_markdown()
    assert reference.main([]) == 0
    assert capsys.readouterr().out.endswith(reference.render_markdown())
