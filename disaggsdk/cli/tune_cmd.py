"""`disaggsdk tune MODEL --gpus N --slo ... --qps Q`: the best prefill:decode layout under SLOs."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "Search prefill:decode ratios and TP/DP shapes by simulated goodput per GPU; emit the best as a spec."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="catalog name or checkpoint directory")
    parser.add_argument("--gpus", type=int, required=True, help="GPU budget")
    parser.add_argument("--slo", required=True, help="e.g. ttft_p90_ms=1000,itl_p99_ms=25 (metrics ttft, tpot, itl, e2el)")
    parser.add_argument("--qps", type=float, required=True, help="target request rate")
    parser.add_argument("--profile", default="h200", help="hardware profile name or YAML path (default h200)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=2048)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--range-ratio", type=float, default=0.5)
    parser.add_argument("--duration-s", type=float, default=120.0, help="simulated seconds per trial (default 120)")
    parser.add_argument("--weight-dtype", help="fp8 or bfloat16 (default: fp8 for deepseek-r1, else bfloat16)")
    parser.add_argument("--out", help="write the best layout's spec to this YAML file")
    parser.add_argument("--json", action="store_true", help="print the ranking as JSON")


def run(args: argparse.Namespace) -> int:
    import attrs

    from disaggsdk.errors import SpecError
    from disaggsdk.models import resolve_model
    from disaggsdk.sim.hardware import load_profile
    from disaggsdk.sim.simulator import SimConfig, default_weight_dtype
    from disaggsdk.sim.tune import parse_slos, tune
    from disaggsdk.sim.workload import Workload
    from disaggsdk.spec import Hardware, Spec, save_spec, spec_to_dict

    if args.gpus < 1 or args.qps <= 0:
        raise SpecError("--gpus must be >= 1 and --qps > 0")
    slos = parse_slos(args.slo)
    arch = resolve_model(args.model)
    profile = load_profile(args.profile)
    gpu_kind = profile.name if profile.name in ("h100", "h200") else "h200"
    base = Spec(model=args.model, hardware=Hardware(gpu=gpu_kind, gpus_per_node=args.gpus_per_node,
                                                    nics_per_node=profile.nics_per_node, nic_gbps=profile.nic_gbps))
    config = SimConfig(profile, weight_dtype=args.weight_dtype or default_weight_dtype(args.model))
    workload = Workload(1.0, args.duration_s, args.input_len, args.output_len, args.range_ratio)
    rows = tune(base, arch, config, slos, workload, args.gpus, args.qps)
    best = next((r for r in rows if r["fits"]), None)
    if args.out and best is not None:
        save_spec(attrs.evolve(best["spec"], name=f"{args.model}-tuned"), args.out)
    if args.json:
        out = [{k: (spec_to_dict(v) if k == "spec" else v) for k, v in r.items()} for r in rows]
        json.dump({"slos": slos, "qps": args.qps, "gpus": args.gpus, "ranking": out}, sys.stdout, indent=2)
        print()
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{args.model} on {profile.name}: {args.qps} qps within {args.gpus} GPUs, SLOs {args.slo}")
        table.add_column("layout", no_wrap=True)
        for col in ("unit GPUs", "max qps/unit", "goodput/GPU", "units", "GPUs", "fits"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(r["label"], str(r["unit_gpus"]), f"{r['max_qps']:.2f}", f"{r['goodput_per_gpu']:.3f}",
                          str(r["units"]), str(r["gpus_needed"]), "yes" if r["fits"] else "no")
        Console().print(table)
        if best is None:
            Console(stderr=True).print(f"[red]no layout meets the SLOs at {args.qps} qps within {args.gpus} GPUs[/]")
        elif args.out:
            Console().print(f"best: {best['label']} x {best['units']} -> {args.out}")
    return 0 if best is not None else 1
