"""`disaggsdk calibrate`: time this machine's engine and fit the ``cpu-local`` hardware profile."""

from __future__ import annotations

import argparse
import json
import sys

from disaggsdk.cli.options import add_hidden_alias
from disaggsdk.cli.path_options import PathOption, writing

HELP = "Time the local engine on a grid of batches and lengths and fit a hardware profile (cpu-local)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="qwen3-coder-tiny", help="tiny catalog model or checkpoint directory")
    parser.add_argument("--name", default="cpu-local", help="profile name")
    parser.add_argument("--output", default=None, metavar="FILE", action=PathOption, kind="output file",
                        help="profile path (default: the user profile folder, found by name)")
    add_hidden_alias(parser, "--out", dest="output")
    parser.add_argument("--deployment", metavar="SPEC",
                        help="also launch this CPU spec (e.g. specs/tiny_local.yaml) and fit the serving stack's "
                             "overheads (per step, per messenger step, per request, per disaggregated handoff)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="time the engine grid this many times, each sample the median (5: about 30 s)")
    parser.add_argument("--json", action="store_true", help="print the samples, fit and path as JSON")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    import attrs

    from disaggsdk.calibrate.engine_profile import save_profile
    from disaggsdk.calibrate.serving import calibrate_machine
    from disaggsdk.errors import SpecError
    from disaggsdk.models import resolve_model
    from disaggsdk.sim.cost_model import StepCostModel
    from disaggsdk.sim.hardware import user_profile_dir

    if args.rounds < 1:
        raise SpecError(f"--rounds: expected a count of at least 1, got {args.rounds}")
    arch = resolve_model(args.model)
    if args.deployment is not None:  # "" too: a path the user gave, not "no deployment"
        from disaggsdk.face.deployment import launch  # the serve extra: only a deployment needs it
        from disaggsdk.spec import load_spec

        spec = load_spec(args.deployment)  # a bad spec fails before minutes of timing
        profile, rms, samples, serving = calibrate_machine(args.model, spec, launch=launch, name=args.name,
                                                           rounds=args.rounds)
    else:
        profile, rms, samples, serving = calibrate_machine(args.model, name=args.name, rounds=args.rounds)
    path = Path(args.output) if args.output else user_profile_dir() / f"{args.name}.yaml"
    with writing("--output" if args.output else "--name", path):
        save_profile(profile, path)
    cost = StepCostModel(arch, profile, weight_dtype="float32", kv_dtype="float32")
    rows = [dict(attrs.asdict(s), predicted_s=cost.step_time_s(s.num_tokens, s.num_sequences, s.context_pairs,
                                                                 s.kv_read_tokens)) for s in samples]
    if args.json:
        json.dump({"profile": str(path), "rms_relative_error": rms, "samples": rows, "serving": serving},
                  sys.stdout, indent=2)
        print()
        return 0
    from rich.table import Table

    from disaggsdk.report.console import make_console

    table = Table(title=f"calibration of {args.model}: RMS relative error {rms:.1%}")
    for col in ("tokens", "sequences", "measured ms", "model ms"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["num_tokens"]), str(r["num_sequences"]), f"{r['seconds'] * 1e3:.2f}", f"{r['predicted_s'] * 1e3:.2f}")
    console = make_console()
    console.print(table)
    console.print(f"matrix rate {profile.bf16_tflops * 1e3:.1f} GFLOP/s, memory {profile.hbm_gb_per_s:.1f} GB/s, "
                  f"per step {profile.step_overhead_ms:.2f} ms (+{profile.messenger_step_overhead_ms:.2f} with a "
                  f"messenger), per request {profile.request_overhead_ms:.1f} ms, "
                  f"per handoff {profile.handoff_overhead_ms:.1f} ms; front end {profile.frontend_cpu_ms_per_token:.2f} "
                  f"ms CPU per token, client {profile.client_cpu_ms_per_token:.2f}; "
                  f"speed monitor {profile.monitor_prefill_cpu_ms:.1f} "
                  f"ms prefill, {profile.monitor_decode_step_cpu_ms:.2f} ms decode step -> {path}")
    return 0
