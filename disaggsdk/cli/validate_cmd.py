"""`disaggsdk validate SPEC...`: check spec files and print every problem with its YAML path."""

from __future__ import annotations

import argparse

from rich.markup import escape

from disaggsdk.errors import SpecError, printable
from disaggsdk.report.console import make_console

HELP = ("Check deployment spec files, their ranks' memory included; print every problem with its YAML path and "
        "the fix.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="YAML spec file(s)")


def run(args: argparse.Namespace) -> int:
    from disaggsdk.plan.memory import check_memory
    from disaggsdk.spec import load_spec

    out = make_console(highlight=False)
    err = make_console(stderr=True, highlight=False)
    failed = False
    for path in args.specs:
        try:
            spec = load_spec(path)
            check_memory(spec)  # weights, workspace and KV against each rank's device (docs/memory.md)
        except SpecError as exc:
            failed = True
            err.print(f"[bold red]{escape(printable(path))}: {len(exc.problems)} problem(s)[/]", soft_wrap=True)
            for problem in exc.problems:
                err.print(f"  [red]error:[/] {escape(problem)}", soft_wrap=True)
            continue
        p, d = spec.prefill, spec.decode
        out.print(
            f"[green]{escape(printable(path))}: valid[/] — {escape(spec.label)}: model {escape(spec.model)} on {spec.device}, "
            f"{p.replicas} prefill x (tp={p.tp}, dp={p.dp}), {d.replicas} decode x (tp={d.tp}, dp={d.dp}), "
            f"KV {spec.kv.layout} pages of {spec.kv.page_size} tokens ({spec.kv.dtype})",
            soft_wrap=True,
        )
    return 2 if failed else 0
