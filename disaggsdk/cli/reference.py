"""The CLI reference (docs/cli.md), generated from the parsers `disaggsdk` runs.

`cli.main.build_parser` builds the one parser the console script parses with; this module reads
every command off it (and every action of a command that has actions, such as ``testbed build``):
its help line, its arguments in the parser's groups, each with the help text ``--help`` prints
(defaults included, hidden aliases left out). The page is Markdown of its own making rather than
argparse's formatted help, so it does not change with the terminal's width or argparse's layout
between Python versions. tests/docs/test_cli_reference.py fails when the committed page differs
from what this module writes; regenerate it with ``python -m disaggsdk.cli.reference --write``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from disaggsdk.cli.main import build_parser
from disaggsdk.cli.options import EXIT_CODES_EPILOG

REGENERATE = "python -m disaggsdk.cli.reference --write"
PAGE = Path("docs") / "cli.md"
# argparse's own groups: their arguments are listed without a group title
UNTITLED_GROUPS = ("positional arguments", "options")


def commands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """``(prog, parser, help line)`` of every command, each followed by its actions (``disaggsdk
    testbed build``), in the order of ``--help``."""
    found = []
    for action in _subparser_actions(parser):
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, command in action.choices.items():
            found.append((command.prog, command, helps.get(name, "")))
            found += commands(command)
    return found


def _subparser_actions(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def _metavar(action: argparse.Action) -> str:
    if isinstance(action.metavar, str):
        return action.metavar
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return "{" + ",".join(str(choice) for choice in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def argument_text(action: argparse.Action) -> str:
    """How the argument is written: ``SPEC``, ``[SPEC ...]``, ``--tp TP``, ``-o, --output FILE``."""
    metavar = _metavar(action)
    nargs = action.nargs
    if nargs == 0:
        values = ""
    elif nargs is None or nargs == argparse.PARSER:
        values = metavar
    elif nargs == argparse.OPTIONAL:
        values = f"[{metavar}]"
    elif nargs == argparse.ZERO_OR_MORE:
        values = f"[{metavar} ...]"
    elif nargs == argparse.ONE_OR_MORE:
        values = f"{metavar} [{metavar} ...]"
    else:
        values = " ".join([metavar] * int(nargs))
    if not action.option_strings:
        return values
    return ", ".join(action.option_strings) + (f" {values}" if values else "")


def help_text(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The argument's help as ``--help`` prints it (``%(default)s`` filled in, the default appended by
    `cli.options.HelpFormatter` where it says something), on one line."""
    formatter = parser._get_formatter()
    return " ".join(formatter._expand_help(action).split()) if action.help else ""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _usage(prog: str, parser: argparse.ArgumentParser) -> str:
    positionals = [argument_text(a) for a in parser._actions if not a.option_strings and a.help != argparse.SUPPRESS]
    return " ".join([prog, "[options]", *positionals])


def _arguments_markdown(parser: argparse.ArgumentParser) -> list[str]:
    """One table of the positional arguments and options, then one per named group ("load", "output")."""
    tables: list[tuple[str | None, list[argparse.Action]]] = [(None, [])]
    for group in parser._action_groups:
        shown = [a for a in group._group_actions
                 if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
        if group.title in UNTITLED_GROUPS:
            tables[0][1].extend(shown)
        elif shown:
            tables.append((group.title, shown))
    lines = []
    for title, actions in tables:
        if not actions:
            continue
        if title is not None:
            lines += [f"*{title}*", ""]
        lines += ["| argument | what it does |", "|---|---|"]
        for action in actions:
            if isinstance(action, argparse._SubParsersAction):
                text = "one of: " + ", ".join(f"`{name}`" for name in action.choices)
            else:
                text = help_text(parser, action)
            lines.append(f"| `{_cell(argument_text(action))}` | {_cell(text)} |")
        lines.append("")
    return lines


def _anchor(prog: str) -> str:
    # Python-Markdown's toc slug of a heading "disaggsdk transfer-bench"
    return prog.replace(" ", "-")


def render_markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """docs/cli.md: the top-level options, a table of the commands, then each command's arguments.

    Args:
        parser: the parser to describe; `cli.main.build_parser`'s when None.
    """
    parser = parser or build_parser()
    found = commands(parser)
    lines = [
        "# Command line reference",
        "",
        f"<!-- generated by `{REGENERATE}` from the parsers `disaggsdk` runs; do not edit -->",
        "",
        f"`{parser.prog}`: {' '.join((parser.description or '').split())} Every command takes `--help`, "
        "which prints what this page shows.",
        "",
        *_arguments_markdown(parser),
        "| command | what it does |",
        "|---|---|",
        *[f"| [`{prog}`](#{_anchor(prog)}) | {_cell(' '.join(text.split()))} |" for prog, _, text in found],
        "",
        "Exit codes, the same for every command:",
        "",
        "```",
        *EXIT_CODES_EPILOG.splitlines()[1:],
        "```",
        "",
    ]
    for prog, command, text in found:
        lines += [f"## {prog}", "", " ".join(text.split()), "", f"`{_usage(prog, command)}`", "",
                  *_arguments_markdown(command)]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print docs/cli.md, or with ``--write`` write it under ``--root`` (the repository, by default
    the current directory). Returns the exit code."""
    args_parser = argparse.ArgumentParser(description="Generate the CLI reference (docs/cli.md) from the parsers.")
    args_parser.add_argument("--write", action="store_true", help=f"write {PAGE} instead of printing it")
    args_parser.add_argument("--root", type=Path, default=Path("."), help="the repository's root")
    args = args_parser.parse_args(argv)
    text = render_markdown()
    if not args.write:
        sys.stdout.write(text)
        return 0
    (args.root / PAGE).write_text(text, encoding="utf-8")
    print(f"wrote {args.root / PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
