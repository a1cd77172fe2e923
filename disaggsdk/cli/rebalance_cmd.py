"""`disaggsdk rebalance URL --prefill N --decode M`: change units' roles in a running deployment."""

from __future__ import annotations

import argparse

from disaggsdk.cli.control_client import post_control
from disaggsdk.cli.options import add_api_key_option
from disaggsdk.report.console import make_console

HELP = ("Change how many units of a running deployment prefill and how many decode, live: a decode unit leaving "
        "decode hands its running requests to the others with their KV first; no request fails. Only healthy units "
        "turn; a layout that needs a unit that is down or would leave no routable decode unit is refused (409), as "
        "is a rebalance while another runs.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the deployment's server (http://host:port)")
    parser.add_argument("--prefill", type=int, required=True, metavar="N", help="units that prefill after it")
    parser.add_argument("--decode", type=int, required=True, metavar="M", help="units that decode after it (>= 1)")
    add_api_key_option(parser)


def run(args: argparse.Namespace) -> int:
    answer = post_control(args.url, "/rebalance", {"prefill": args.prefill, "decode": args.decode}, args.api_key,
                          timeout_s=300)
    out = make_console(highlight=False)
    for c in answer["changes"]:
        moved = sum(m["moved"] for m in c["moves"])
        how = f"in {c['seconds']:.1f} s" + (f", {moved} request(s) moved with their KV" if c["moves"] else "")
        out.print(f"  {c['unit']}: {c['before']} -> {c['after']} " + (how if c["done"] else f"failed: {c['reason']}"),
                  soft_wrap=True)
    roles = answer["roles"]
    out.print(f"roles now: {', '.join(f'{u} {r}' for u, r in sorted(roles.items()))}"
              + ("" if answer["changes"] else " (nothing to change)"))
    return 0 if answer["done"] else 1
