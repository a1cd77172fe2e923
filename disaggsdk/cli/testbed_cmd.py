"""`disaggsdk testbed up|status|down`: many machines on one, for measuring across real links.

``up`` builds nodes in their own namespaces joined by shaped links and returns, leaving them up;
``status`` and ``down`` find them again by name (the state file in /run/disaggsdk-testbed). All
three need root. See docs/testbed.md.
"""

from __future__ import annotations

import argparse
import json

from disaggsdk.cli.options import EXIT_CODES_EPILOG, HelpFormatter, add_global_options
from disaggsdk.testbed.naming import DEFAULT_NAME

HELP = "Build, show or remove a testbed: nodes in their own namespaces joined by shaped links (needs root)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="testbed_action", metavar="ACTION", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help_text, description=help_text, epilog=EXIT_CODES_EPILOG,
                                 formatter_class=HelpFormatter)
        sub.add_argument("--name", default=DEFAULT_NAME, help="the testbed's name (letters and digits)")
        add_global_options(sub, top_level=False)
        return sub

    up = action("up", "Build N nodes linked to one switch and leave them up; print each node's name and address.")
    # strings, read in run(): a bad value is one line of error, not argparse's usage block
    up.add_argument("--nodes", required=True, metavar="N", help="how many nodes")
    up.add_argument("--link", required=True, metavar="RATE[,DELAY[,LOSS]]",
                    help="each node's link: rate with a bit unit (100mbit, 1gbit), one-way delay (5ms) and "
                         "loss (1%%) between nodes; without the kernel's sch_netem a delay takes iptables, a loss nftables")
    up.add_argument("--ray", action="store_true", help="start a Ray node in each node (head in node 0)")
    up.add_argument("--ray-port", default="6379", metavar="PORT", help="the Ray head's port in node 0")
    up.add_argument("--ray-resources", default=None, metavar="JSON",
                    help='custom resources each Ray node offers, e.g. \'{"disaggsdk_slot": 8}\'')
    up.add_argument("--json", action="store_true", help="print the testbed as JSON")
    status = action("status", "Show each node's address and the bytes its link carried.")
    status.add_argument("--json", action="store_true", help="print JSON")
    action("down", "Stop Ray and every process in the nodes, delete the namespaces and the state file.")
    bench = action("bench", "Measure KV transfer across a shaped link: prefill in node 0, decode in node 1, exposed "
                            "transfer with layer streaming and without, KV goodput, TTFT vs the simulator (JSON).")
    bench.add_argument("spec", nargs="?", default="specs/tiny_pd.yaml",
                       help="a CPU spec of one prefill and one decode instance (default: specs/tiny_pd.yaml)")
    bench.add_argument("--input-lens", default="1024,4096,16384", metavar="N,N,...", help="prompt lengths (tokens)")
    bench.add_argument("--ratios", default="0.5,1,3", metavar="R,R,...",
                       help="shaped rates, as the whole transfer's time over the prefill's compute at each length")
    bench.add_argument("--num-prompts", default="3", metavar="N", help="measured requests per length and rate")
    bench.add_argument("--reference-rate", default="10gbit", metavar="RATE",
                       help="the rate C and the bytes are measured at, and TTFT penalties are taken against")


def run(args: argparse.Namespace) -> int:
    if args.testbed_action == "up":
        return _up(args)
    if args.testbed_action == "status":
        return _status(args)
    if args.testbed_action == "bench":
        return _bench(args)
    return _down(args)


def _up(args: argparse.Namespace) -> int:
    from disaggsdk.testbed import LinkSpec, RayOptions, TestbedError, up

    nodes = _whole_number("--nodes", args.nodes)
    try:
        link = LinkSpec.parse(args.link)
        ray = (RayOptions(port=_whole_number("--ray-port", args.ray_port), resources=_resources(args.ray_resources))
               if args.ray else None)
    except ValueError as exc:
        raise TestbedError(str(exc)) from None
    testbed = up(nodes=nodes, link=link, name=args.name, ray=ray)
    if args.json:
        print(json.dumps(testbed.to_dict()))
        return 0
    print(f"testbed {testbed.name}: {len(testbed.nodes)} node(s), link {testbed.link.describe()}")
    for node in testbed.nodes:
        print(f"  {node.name}  {node.address}  netns {node.namespace}  anchor pid {node.anchor_pid}")
    if testbed.ray_address is not None:
        print(f"ray_address {testbed.ray_address}")
    print(f"run in node 0: nsenter --target {testbed.node(0).anchor_pid} --mount --uts --ipc --net --pid -- CMD")
    print(f"take it down:  disaggsdk testbed down --name {testbed.name}")
    return 0


def _status(args: argparse.Namespace) -> int:
    from disaggsdk.testbed import status

    testbed, nodes = status(args.name)
    if args.json:
        print(json.dumps({"name": testbed.name, "link": testbed.link.to_dict(), "ray_address": testbed.ray_address,
                          "complete": testbed.complete, "nodes": [node.to_dict() for node in nodes]}))
        return 0
    print(f"testbed {testbed.name}: link {testbed.link.describe()}"
          + (f", ray_address {testbed.ray_address}" if testbed.ray_address else "")
          + ("" if testbed.complete else " (half-built)"))
    for node in nodes:
        state = "up" if node.alive else "DOWN"
        print(f"  {node.name}  {node.address}  {state}  rx_bytes {node.rx_bytes}  tx_bytes {node.tx_bytes}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from disaggsdk.testbed import down

    removed = down(args.name)
    print(f"testbed {args.name} is down" if removed else f"no testbed {args.name} was up")
    return 0


def _bench(args: argparse.Namespace) -> int:
    import sys

    from disaggsdk.calibrate.link_bench import run_link_bench
    from disaggsdk.spec import load_spec
    from disaggsdk.testbed import TestbedError
    from disaggsdk.testbed.link import parse_rate_mbit

    try:
        reference_mbit = parse_rate_mbit(args.reference_rate)
        input_lens = [int(n) for n in args.input_lens.split(",")]
        ratios = [float(r) for r in args.ratios.split(",")]
    except ValueError as exc:
        raise TestbedError(f"testbed bench: {exc}; e.g. --input-lens 1024,4096 --ratios 0.5,1,3 "
                           "--reference-rate 10gbit") from None
    num_prompts = _whole_number("--num-prompts", args.num_prompts)
    if min(input_lens) < 2 or min(ratios) <= 0 or num_prompts < 1:
        raise TestbedError("testbed bench: prompt lengths of at least 2 tokens, positive ratios and at least one "
                           "prompt, e.g. --input-lens 1024 --ratios 1 --num-prompts 3")
    result = run_link_bench(load_spec(args.spec), input_lens, ratios, num_prompts, reference_mbit, name=args.name,
                            on_progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(json.dumps(result, indent=2))
    return 0


def _resources(text: str | None) -> dict[str, float]:
    if text is None:
        return {}
    try:
        parsed: object = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(isinstance(v, int | float) and not isinstance(v, bool)
                                               for v in parsed.values()):
        raise ValueError(f"--ray-resources {text!r}: give a JSON object of numbers, e.g. '{{\"disaggsdk_slot\": 8}}'")
    return {str(key): float(value) for key, value in parsed.items()}


def _whole_number(option: str, text: str) -> int:
    from disaggsdk.testbed import TestbedError

    try:
        return int(text)
    except ValueError:
        raise TestbedError(f"{option} {text!r}: give a whole number") from None
