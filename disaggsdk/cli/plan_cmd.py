"""`disaggsdk plan SPEC [--json] [--input-len N]`: show how a deployment shards and moves its KV."""

from __future__ import annotations

import argparse
import json
import sys

from disaggsdk.cli.options import add_hidden_alias

HELP = "Show a spec's plan: ranks on nodes/GPUs/NICs, KV sharding, transfer routes, write counts."


def _token_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        msg = f"expected a whole number of tokens, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a prompt cannot have {value} tokens; use 0 or more")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="YAML spec file")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the plan as JSON (schema: docs/plan-json.md) instead of tables",
    )
    parser.add_argument(
        "--input-len",
        type=_token_count,
        default=1024,
        metavar="N",
        help="prompt tokens for the expected write counts",
    )
    add_hidden_alias(parser, "--tokens", dest="input_len", type=_token_count, metavar="N")


def run(args: argparse.Namespace) -> int:
    from disaggsdk.plan import make_plan
    from disaggsdk.plan.render import plan_renderable
    from disaggsdk.report.console import make_console
    from disaggsdk.spec import load_spec

    plan = make_plan(load_spec(args.spec))
    if args.json:
        sys.stdout.write(json.dumps(plan.to_json(num_tokens=args.input_len), indent=2) + "\n")
    else:
        make_console(highlight=False).print(plan_renderable(plan, num_tokens=args.input_len))
    problems = plan.memory_problems
    if problems:
        from disaggsdk.errors import SpecError

        raise SpecError(problems)  # the CLI prints each with its path and exits 2 (as validate)
    return 0
