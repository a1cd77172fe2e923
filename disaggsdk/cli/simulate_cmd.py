"""`disaggsdk simulate SPEC`: cluster-scale TTFT / TPOT / ITL / throughput without GPUs."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "Simulate a spec under a workload on a hardware profile (disaggregated and/or colocated)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="YAML spec file")
    parser.add_argument("--qps", default="1", help="request rate(s), comma-separated (default 1)")
    parser.add_argument("--duration-s", type=float, default=600.0, help="seconds of traffic (default 600)")
    parser.add_argument("--input-len", type=int, default=2048)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1±r)")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 is Poisson")
    parser.add_argument("--trace", help="JSON-lines trace {arrival_s, input_len, output_len} (replaces --qps)")
    parser.add_argument("--profile", help="hardware profile name or YAML path (default: from the spec's hardware.gpu)")
    parser.add_argument("--weight-dtype", help="fp8 or bfloat16 (default: fp8 for deepseek-r1, else bfloat16)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192, help="chunked-prefill budget per step")
    parser.add_argument("--mtp-acceptance", type=float, default=0.0,
                        help="MTP speculative decoding: accepted fraction of draft tokens (0 = off)")
    parser.add_argument("--no-streaming", action="store_true", help="ablation: send KV after the forward pass")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--colocated", action="store_true", help="simulate the same GPUs as colocated instances")
    mode.add_argument("--compare", action="store_true", help="simulate both layouts side by side")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _rates(text: str) -> list[float]:
    from disaggsdk.errors import SpecError

    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"--qps: expected numbers separated by commas, got {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise SpecError(f"--qps: every rate must be positive, got {text!r}")
    return rates


def run(args: argparse.Namespace) -> int:
    from disaggsdk.sim.runner import default_profile_name, run_simulations
    from disaggsdk.sim.simulator import SimConfig, default_weight_dtype
    from disaggsdk.sim.hardware import load_profile
    from disaggsdk.spec import load_spec

    spec = load_spec(args.spec)
    profile = load_profile(args.profile or default_profile_name(spec))
    config = SimConfig(profile, weight_dtype=args.weight_dtype or default_weight_dtype(spec.model),
                       max_num_batched_tokens=args.max_num_batched_tokens, streaming=not args.no_streaming,
                       mtp_acceptance=args.mtp_acceptance)
    layouts = [False, True] if args.compare else [args.colocated]
    result = run_simulations(
        spec, config, layouts, rates=None if args.trace else _rates(args.qps), trace=args.trace,
        duration_s=args.duration_s, input_len=args.input_len, output_len=args.output_len,
        range_ratio=args.range_ratio, burstiness=args.burstiness, seed=args.seed,
    )
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    from rich.console import Console

    from disaggsdk.sim.render import runs_table

    Console().print(runs_table(result))
    return 0
