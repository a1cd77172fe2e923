"""`disaggsdk move URL REQUEST_ID --to UNIT`: move one decoding request to another decode unit, with its KV."""

from __future__ import annotations

import argparse

from disaggsdk.cli.control_client import post_control
from disaggsdk.cli.options import add_api_key_option
from disaggsdk.report.console import make_console

HELP = "Move one decoding request of a running deployment to another decode unit with its KV; it continues exactly."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the deployment's server (http://host:port)")
    parser.add_argument("request_id", metavar="REQUEST_ID",
                        help="the response's id (cmpl-..., chatcmpl-...) or the X-Request-Id the client sent")
    parser.add_argument("--to", required=True, metavar="UNIT", help="the decode unit to move it to")
    add_api_key_option(parser)


def run(args: argparse.Namespace) -> int:
    m = post_control(args.url, f"/requests/{args.request_id}/move", {"to": args.to}, args.api_key, timeout_s=90)
    out = make_console(highlight=False)
    if m["moved"]:
        out.print(f"{m['request_id']}: moved from {m['source']} to {m['target']} after {m['num_output_tokens']} "
                  f"token(s), {m['num_bytes']} KV bytes")
        return 0
    out.print(f"{m['request_id']}: not moved ({m['reason']}); it goes on at {m['source']}", soft_wrap=True)
    return 1
