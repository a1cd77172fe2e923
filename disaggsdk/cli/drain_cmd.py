"""`disaggsdk drain URL UNIT`: move every request a decode unit decodes to the others, with their KV."""

from __future__ import annotations

import argparse

from disaggsdk.cli.control_client import post_control
from disaggsdk.cli.options import add_api_key_option
from disaggsdk.report.console import make_console

HELP = ("Take a decode unit of a running deployment out of routing and move the requests it decodes to the other "
        "decode units with their KV (no recompute); --undo routes to it again. The last routable decode unit is "
        "refused (409); a drain that does not empty its unit in time routes to it again.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the deployment's server (http://host:port)")
    parser.add_argument("unit", metavar="UNIT", help="the decode unit, e.g. decode-1 (see /health)")
    parser.add_argument("--undo", action="store_true", help="route new requests to UNIT again")
    parser.add_argument("--timeout", type=float, default=60.0, metavar="S",
                        help="wait at most S seconds for its requests to move (default 60)")
    add_api_key_option(parser)


def run(args: argparse.Namespace) -> int:
    out = make_console(highlight=False)
    if args.undo:
        post_control(args.url, f"/units/{args.unit}/undrain", {}, args.api_key, timeout_s=30)
        out.print(f"{args.unit}: routed again")
        return 0
    answer = post_control(args.url, f"/units/{args.unit}/drain", {"timeout_s": args.timeout}, args.api_key,
                          timeout_s=args.timeout + 30)
    moves = answer.get("moves", [])
    for m in moves:
        how = f"moved to {m['target']} ({m['num_bytes']} KV bytes)" if m["moved"] else f"stayed: {m['reason']}"
        out.print(f"  {m['request_id']}: {how}", soft_wrap=True)
    remaining = answer.get("remaining", [])
    done = f"{sum(m['moved'] for m in moves)} of {len(moves)} move(s) done"
    if not remaining:
        out.print(f"{args.unit}: drained; {done}; it takes no new requests until "
                  f"`disaggsdk drain {args.url} {args.unit} --undo`")
        return 0
    routed = "it is routed again (the drain undid itself)" if answer.get("routed") else "it stays out of routing"
    out.print(f"{args.unit}: {len(remaining)} request(s) still there; {done}; {routed}", soft_wrap=True)
    return 1
