"""`disaggsdk tune MODEL --gpus N --slo ... --request-rate Q`: the best prefill:decode layout under SLOs."""

from __future__ import annotations

import argparse
import json
import sys

from disaggsdk.cli.options import add_hidden_alias
from disaggsdk.cli.path_options import PathOption, writing

# spec keys `tune` takes from a flag (the others come from the hardware profile)
FLAGS = {"gpus_per_node": "--gpus-per-node", "memory_utilization": "--memory-utilization",
         "max_model_len": "--max-model-len"}
HELP = "Search prefill:decode ratios and TP/DP shapes by simulated goodput per GPU; emit the best as a spec."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", nargs="?", default=None,
                        help="catalog name or checkpoint directory (or --model)")
    parser.add_argument("--model", dest="model_option", default=None, metavar="MODEL", help="the same as MODEL")
    parser.add_argument("--gpus", type=int, required=True, help="GPU budget")
    parser.add_argument("--slo", required=True, help="e.g. ttft_p90_ms=1000,itl_p99_ms=25 (metrics ttft, tpot, itl, e2el)")
    parser.add_argument("--request-rate", type=float, default=None, help="target request rate per second (required)")
    add_hidden_alias(parser, "--qps", dest="request_rate", type=float)
    parser.add_argument("--profile", default="h200", help="hardware profile name or YAML path")
    parser.add_argument("--gpus-per-node", type=int, default=8, help="GPUs in one node")
    parser.add_argument("--input-len", type=int, default=2048, help="mean prompt tokens")
    parser.add_argument("--output-len", type=int, default=256, help="mean output tokens")
    parser.add_argument("--range-ratio", type=float, default=0.5, help="lengths uniform in len*(1±r)")
    parser.add_argument("--duration-s", type=float, default=120.0, help="simulated seconds per trial")
    parser.add_argument("--weight-dtype",
                        help="fp8 or bfloat16 (default: fp8 for a block-FP8 checkpoint such as deepseek-r1 or "
                             "qwen3-coder-fp8, else bfloat16)")
    parser.add_argument("--memory-utilization", type=float, default=None, metavar="F",
                        help="fraction of each GPU's memory weights, workspace and KV may fill (the spec's "
                             "engine.memory_utilization; default its default)")
    parser.add_argument("--max-model-len", type=int, default=None, metavar="TOKENS",
                        help="longest request, prompt + output (the spec's engine.max_model_len; default the "
                             "model's context): a pool must hold one")
    parser.add_argument("--output", default=None, metavar="FILE", action=PathOption, kind="output file",
                        help="write the best layout's spec to this YAML file")
    add_hidden_alias(parser, "--out", dest="output")
    parser.add_argument("--json", action="store_true", help="print the ranking as JSON")


def run(args: argparse.Namespace) -> int:
    import attrs

    from disaggsdk.errors import SpecError
    from disaggsdk.models import resolve_model
    from disaggsdk.plan.memory import spec_memory_problems
    from disaggsdk.sim.hardware import load_profile
    from disaggsdk.sim.simulator import SimConfig, default_weight_dtype
    from disaggsdk.sim.tune import candidate_units, parse_slos, tune
    from disaggsdk.sim.workload import Workload
    from disaggsdk.spec import EngineSettings, Hardware, Role, Spec, save_spec, spec_to_dict
    from disaggsdk.spec.field_checks import FieldErrors
    from disaggsdk.spec.topology import MAX_RANKS

    if args.model and args.model_option and args.model != args.model_option:
        raise SpecError(f"two models: {args.model} and --model {args.model_option}; give one")
    args.model = args.model or args.model_option
    if not args.model:
        raise SpecError("give the model: disaggsdk tune MODEL (or --model MODEL)")
    if args.request_rate is None:
        raise SpecError("give the target rate: --request-rate Q (requests per second)")
    if args.gpus < 1 or args.request_rate <= 0:
        raise SpecError("--gpus must be >= 1 and --request-rate > 0")
    if args.gpus > MAX_RANKS:
        raise SpecError(f"--gpus {args.gpus:,}: a deployment has at most {MAX_RANKS:,} GPUs (the spec's bound, so a "
                        "plan takes seconds)")
    slos = parse_slos(args.slo)
    arch = resolve_model(args.model)
    profile = load_profile(args.profile)
    gpu_kind = profile.name if profile.name in ("h100", "h200") else "h200"
    weight_dtype = args.weight_dtype or default_weight_dtype(args.model)
    # the deployment's 16-bit tensors in bfloat16 (FP8 ones as stored), as the memory plan counts them
    utilization = args.memory_utilization or EngineSettings().memory_utilization
    try:  # the flags are spec keys: their checks' messages, naming the flag
        engine = EngineSettings(dtype="float32" if weight_dtype == "float32" else "bfloat16",
                                memory_utilization=utilization, max_model_len=args.max_model_len)
        base = Spec(model=args.model, hardware=Hardware(gpu=gpu_kind, gpus_per_node=args.gpus_per_node,
                                                        nics_per_node=profile.nics_per_node, nic_gbps=profile.nic_gbps),
                    engine=engine)
    except FieldErrors as exc:
        raise SpecError([f"{FLAGS.get(name, '--profile ' + profile.name)} ({name}): {message}"
                         for name, message in exc.problems]) from None
    config = SimConfig(profile, weight_dtype=weight_dtype)
    if not candidate_units(base, arch):  # say why rather than "no layout meets the SLOs"
        widest = Role(tp=args.gpus_per_node)
        problems = spec_memory_problems(attrs.evolve(base, prefill=widest, decode=widest), arch)
        raise SpecError([f"no layout of {args.model} on nodes of {args.gpus_per_node} x {gpu_kind} fits its memory "
                         f"(the widest, tp {args.gpus_per_node}, is refused below); pass --max-model-len, "
                         f"--memory-utilization, more --gpus-per-node, or an FP8 checkpoint", *problems])
    workload = Workload(1.0, args.duration_s, args.input_len, args.output_len, args.range_ratio)
    rows = tune(base, arch, config, slos, workload, args.gpus, args.request_rate)
    best = next((r for r in rows if r["fits"]), None)
    if args.output and best is not None:
        with writing("--output", args.output):
            save_spec(attrs.evolve(best["spec"], name=f"{args.model}-tuned"), args.output)
    if args.json:
        out = [{k: (spec_to_dict(v) if k == "spec" else v) for k, v in r.items()} for r in rows]
        json.dump({"slos": slos, "qps": args.request_rate, "gpus": args.gpus, "ranking": out}, sys.stdout, indent=2)
        print()
    else:
        from rich.table import Table

        from disaggsdk.report.console import make_console

        table = Table(title=f"{args.model} on {profile.name}: {args.request_rate} qps within {args.gpus} GPUs, SLOs {args.slo}")
        table.add_column("layout", no_wrap=True)
        for col in ("unit GPUs", "max qps/unit", "goodput/GPU", "units", "GPUs", "fits"):
            table.add_column(col, justify="right")
        for r in rows:
            table.add_row(r["label"], str(r["unit_gpus"]), f"{r['max_qps']:.2f}", f"{r['goodput_per_gpu']:.3f}",
                          str(r["units"]), str(r["gpus_needed"]), "yes" if r["fits"] else "no")
        make_console().print(table)
        if best is None:
            make_console(stderr=True).print(
                f"[red]no layout meets the SLOs at {args.request_rate} qps within {args.gpus} GPUs[/]")
        elif args.output:
            make_console().print(f"best: {best['label']} x {best['units']} -> {args.output}")
    return 0 if best is not None else 1
