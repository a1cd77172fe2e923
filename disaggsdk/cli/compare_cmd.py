"""`disaggsdk compare TRACE --slo ttft=MS,tpot=MS [SPEC ...]`: should I disaggregate, for this traffic?

Each layout that fits this machine (colocated, P:D splits, conditional) is launched and swept for its
goodput rate on the trace, with the simulator's figure for the same runs beside it; then each SPEC's
layouts are simulated at its own scale and hardware. Prints a table and a recommendation with its
reason; ``--plot`` saves the plots, ``--output``/``--json`` the whole result.

    disaggsdk compare code-assistant --slo ttft=1000,tpot=50 specs/qwen3_coder.yaml --plot compare.html
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from disaggsdk.bench.goodput_sweep import DEFAULT_TARGET
from disaggsdk.cli.path_options import PathOption, writing

HELP = ("Should I disaggregate? Goodput of colocated, P:D and conditional layouts on a trace under SLOs: measured "
        "here, simulated at each SPEC's scale; a recommendation and plots.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `compare`."""
    parser.add_argument("trace", metavar="TRACE",
                        help="JSON-lines trace ({\"input_len\" or \"prompt\", \"output_len\"} a line), a ShareGPT "
                             "JSON file, or a shipped trace's name: code-assistant")
    parser.add_argument("specs", nargs="*", default=[], metavar="SPEC",
                        help="target specs, simulated at their scale on their hardware; the first's tiny twin is "
                             "what runs here (default: the tiny qwen3-coder, this machine only)")
    parser.add_argument("--slo", required=True, metavar="ttft=MS,tpot=MS",
                        help="SLOs every counted request meets (ttft, tpot, e2el; milliseconds)")
    parser.add_argument("--goodput-target", type=float, default=DEFAULT_TARGET, metavar="SHARE",
                        help=f"share of requests that must meet every SLO (default {DEFAULT_TARGET})")
    parser.add_argument("--search-steps", type=int, default=4, help="bisections of each layout's rate search")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of each measured sweep (median reported)")
    parser.add_argument("--num-prompts", type=int, default=40, help="requests per measured run")
    parser.add_argument("--seed", type=int, default=0, help="seeds the draws from the trace and the arrivals")
    parser.add_argument("--local-prefill-tokens", type=int, default=512,
                        help="conditional layouts: prompts of at most this many tokens are computed on decode")
    parser.add_argument("--layouts", default="", metavar="NAMES",
                        help="measure only these layouts here, comma-separated names (P1:D1) or kinds (colocated, "
                             "disaggregated, conditional); default all")
    parser.add_argument("--machine-spec", default=None, metavar="SPEC",
                        help="the CPU spec measured here instead of the first SPEC's tiny twin")
    parser.add_argument("--recalibrate", action="store_true",
                        help="time this machine again (cpu-local) before comparing")
    parser.add_argument("--plot", default=None, metavar="FILE", action=PathOption, kind="output file",
                        help="save the plots: .png, .svg or .html")
    parser.add_argument("--output", default=None, metavar="FILE", action=PathOption, kind="output file",
                        help="write the result as JSON")
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def run(args: argparse.Namespace) -> int:
    """Compare, print the table and the recommendation, save what was asked.

    Raises:
        DisaggError: a bad trace, SLO, spec or option.
    """
    from rich.table import Table

    from disaggsdk.bench.goodput_sweep import SweepError
    from disaggsdk.bench.serve_bench import parse_slos
    from disaggsdk.face.compare import compare
    from disaggsdk.report.console import make_console
    from disaggsdk.report.layout_plots import PLOT_SUFFIXES
    from disaggsdk.spec import load_spec

    slos = parse_slos(args.slo)
    if args.plot and Path(args.plot).suffix.lower() not in PLOT_SUFFIXES:
        raise SweepError(f"--plot {args.plot}: save the plots as {', '.join(PLOT_SUFFIXES)}")
    if args.num_prompts < 1 or args.local_prefill_tokens < 1:
        raise SweepError("--num-prompts and --local-prefill-tokens must be >= 1")
    targets = [load_spec(path) for path in args.specs]  # a bad spec fails before minutes of measuring
    machine = load_spec(args.machine_spec) if args.machine_spec is not None else None
    console = make_console(stderr=args.json)
    result = compare(args.trace, slos, targets, machine=machine, goodput_target=args.goodput_target,
                     search_steps=args.search_steps, rounds=args.repeat, num_prompts=args.num_prompts, seed=args.seed,
                     local_prefill_tokens=args.local_prefill_tokens, recalibrate=args.recalibrate,
                     only=[name.strip() for name in args.layouts.split(",") if name.strip()],
                     say=lambda line: console.print(line, highlight=False))
    slo_text = ", ".join(f"{k.upper()} {v:g} ms" for k, v in slos.items())
    table = Table(title=f"goodput: the highest rate at which {args.goodput_target:.0%} of requests met {slo_text}")
    for col in result.HEADERS:
        table.add_column(col, justify="left" if col in ("layout", "where", "limited by") else "right")
    for row in result.rows():
        table.add_row(*row)
    console.print(table)
    for here in result.result["this_machine"]:
        if here["sim_fitted_on"]:
            console.print(f"simulated {here['layout']} here with the profile {here['sim_slowdown']:.2f}x slower: what "
                          f"the flat-out runs of {', '.join(here['sim_fitted_on'])} showed it to overrate",
                          soft_wrap=True, highlight=False)
    for line in result.recommendation:
        console.print(f"[bold]recommended[/] {line}", soft_wrap=True)
    if args.plot:
        with writing("--plot", args.plot):
            console.print(f"plots written to {result.save_plot(args.plot)}")
    if args.output:
        with writing("--output", args.output):
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(result.result, indent=2) + "\n")
        console.print(f"results written to {args.output}")
    if args.json:
        json.dump(result.result, sys.stdout)
        sys.stdout.write("\n")
    return 0
