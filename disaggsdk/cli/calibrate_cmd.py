"""`disaggsdk calibrate`: time this machine's engine and fit the ``cpu-local`` hardware profile."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "Time the local engine on a grid of batches and lengths and fit a hardware profile (cpu-local)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="qwen3-coder-tiny", help="tiny catalog model or checkpoint directory")
    parser.add_argument("--name", default="cpu-local", help="profile name (default cpu-local)")
    parser.add_argument("--out", help="profile path (default: the user profile folder, found by name)")
    parser.add_argument("--deployment", metavar="SPEC",
                        help="also launch this CPU spec (e.g. specs/tiny_local.yaml) and fit the serving stack's "
                             "overheads (per step, per messenger step, per request, per disaggregated handoff)")
    parser.add_argument("--json", action="store_true", help="print the samples, fit and path as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import attrs

    from disaggsdk.models import resolve_model
    from disaggsdk.sim.calibrate import fit_profile, save_profile, time_engine, user_profile_dir
    from disaggsdk.sim.cost_model import StepCostModel

    arch = resolve_model(args.model)
    samples = time_engine(args.model)
    profile, rms = fit_profile(arch, samples, name=args.name)
    serving = None
    if args.deployment:
        from disaggsdk.sim.calibrate import fit_serving_overheads
        from disaggsdk.spec import load_spec

        profile, serving = fit_serving_overheads(load_spec(args.deployment), profile)
    path = save_profile(profile, Path(args.out) if args.out else user_profile_dir() / f"{args.name}.yaml")
    cost = StepCostModel(arch, profile, weight_dtype="float32", kv_dtype="float32")
    rows = [dict(attrs.asdict(s), predicted_s=cost.step_time_s(s.num_tokens, s.num_sequences, s.context_pairs,
                                                                 s.kv_read_tokens)) for s in samples]
    if args.json:
        json.dump({"profile": str(path), "rms_relative_error": rms, "samples": rows, "serving": serving},
                  sys.stdout, indent=2)
        print()
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"calibration of {args.model}: RMS relative error {rms:.1%}")
    for col in ("tokens", "sequences", "measured ms", "model ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["num_tokens"]), str(r["num_sequences"]), f"{r['seconds'] * 1e3:.2f}", f"{r['predicted_s'] * 1e3:.2f}")
    console = Console()
    console.print(table)
    console.print(f"matrix rate {profile.bf16_tflops * 1e3:.1f} GFLOP/s, memory {profile.hbm_gb_per_s:.1f} GB/s, "
                  f"per step {profile.step_overhead_ms:.2f} ms (+{profile.messenger_step_overhead_ms:.2f} with a "
                  f"messenger), per request {profile.request_overhead_ms:.1f} ms, "
                  f"per handoff {profile.handoff_overhead_ms:.1f} ms -> {path}")
    return 0
