"""`disaggsdk simulate SPEC`: cluster-scale TTFT / TPOT / ITL / throughput without GPUs.

`disaggsdk simulate --published [NAME]` instead simulates the published deployments of
`disaggsdk.sim.published` from their specs under specs/published/, each with the workload its source
states, and prints published vs simulated figures (docs/published.md is that output).
"""

from __future__ import annotations

import argparse
import json
import sys

from disaggsdk.cli.options import add_hidden_alias
from disaggsdk.cli.path_options import PathOption

HELP = "Simulate a spec under a workload on a hardware profile (disaggregated and/or colocated)."
ALL_PUBLISHED = "*"  # `--published` with no NAME


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", nargs="?", help="YAML spec file (not with --published)")
    parser.add_argument("--published", nargs="?", const=ALL_PUBLISHED, metavar="NAME",
                        help="instead of a SPEC: simulate every published deployment, or the one named, from its spec "
                             "under specs/published/ with the workload its source states, and print published vs "
                             "simulated figures with the error (docs/published.md); exit status 1 when a figure "
                             "misses")
    parser.add_argument("--no-aiconfigurator", action="store_true",
                        help="with --published: do not run AIConfigurator's prediction beside ours even where the "
                             "`aiconfigurator` command is installed")
    parser.add_argument("--request-rate", default="1", metavar="RATE[,RATE]",
                        help="request rate(s) per second, comma-separated")
    add_hidden_alias(parser, "--qps", dest="request_rate")
    parser.add_argument("--duration-s", type=float, default=600.0, help="seconds of traffic")
    parser.add_argument("--input-len", type=int, default=2048, help="mean prompt tokens")
    parser.add_argument("--output-len", type=int, default=256, help="mean output tokens")
    parser.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1±r)")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 is Poisson")
    parser.add_argument("--trace", action=PathOption, kind="input file",
                        help="JSON-lines trace {arrival_s, input_len, output_len} (replaces --request-rate)")
    parser.add_argument("--profile", help="hardware profile name or YAML path (default: from the spec's hardware.gpu)")
    parser.add_argument("--kernels", metavar="FRAMEWORK@VERSION|roofline",
                        help="the measured kernel tables a GPU profile's steps are priced from (default: the "
                             "profile's, sglang@0.5.14 for h100 and h200; e.g. vllm@0.24.0); roofline: the "
                             "profile's block roofline alone, as before the tables")
    parser.add_argument("--weight-dtype",
                        help="fp8 or bfloat16 (default: fp8 for a block-FP8 checkpoint such as deepseek-r1, else bfloat16)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192, help="chunked-prefill budget per step")
    parser.add_argument("--mtp-acceptance", default=None, metavar="FRACTION|FILE",
                        help="MTP speculative decoding's first-draft acceptance: a number in [0, 1] or a "
                             "`bench SPEC --output` JSON of a run with speculative mtp (measured); needed when "
                             "the spec drafts with mtp, 0 (off) otherwise")
    parser.add_argument("--no-streaming", action="store_true", help="ablation: send KV after the forward pass")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--colocated", action="store_true", help="simulate the same GPUs as colocated instances")
    mode.add_argument("--compare", action="store_true", help="simulate both layouts side by side")
    parser.add_argument("--validate", action="store_true",
                        help="launch the spec and its colocated twin for real, bench them at --request-rate, "
                             "replay the same requests in the simulator (cpu-local profile) and compare")
    parser.add_argument("--num-prompts", type=int, default=40, help="requests per rate with --validate")
    parser.add_argument("--repeat", type=int, default=1,
                        help="with --validate: runs per rate; rows compare medians (noisy machines)")
    parser.add_argument("--no-speed-correction", action="store_true",
                        help="with --validate: simulate on the profile as calibrated, not re-timed to the speed "
                             "the speed monitor saw during each run")
    parser.add_argument("--seed", type=int, default=0, help="seeds the workload (lengths, arrivals)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _rates(text: str) -> list[float]:
    from disaggsdk.errors import SpecError

    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"--request-rate (--qps): expected numbers separated by commas, got {text!r}") from None
    if not rates or any(r <= 0 for r in rates):
        raise SpecError(f"--request-rate (--qps): every rate must be positive, got {text!r}")
    return rates


def run(args: argparse.Namespace) -> int:
    from disaggsdk.errors import SpecError
    from disaggsdk.sim.hardware import load_profile
    from disaggsdk.sim.runner import default_profile_name, run_simulations
    from disaggsdk.sim.simulator import SimConfig, default_weight_dtype
    from disaggsdk.spec import load_spec

    if args.published is not None:
        return _published(args)
    if args.spec is None:
        raise SpecError("simulate: give a SPEC file, or --published [NAME] for the published deployments")
    if args.no_aiconfigurator:
        raise SpecError("--no-aiconfigurator goes with --published")
    spec = load_spec(args.spec)
    profile = _with_kernels(load_profile(args.profile or default_profile_name(spec)), args.kernels)
    if args.validate:
        return _validate(args, spec, profile)
    acceptance, source = _mtp_acceptance(args.mtp_acceptance, spec)
    config = SimConfig(profile, weight_dtype=args.weight_dtype or default_weight_dtype(spec.model),
                       max_num_batched_tokens=args.max_num_batched_tokens, streaming=not args.no_streaming,
                       mtp_acceptance=acceptance)
    layouts = [False, True] if args.compare else [args.colocated]
    result = run_simulations(
        spec, config, layouts, rates=None if args.trace else _rates(args.request_rate), trace=args.trace,
        duration_s=args.duration_s, input_len=args.input_len, output_len=args.output_len,
        range_ratio=args.range_ratio, burstiness=args.burstiness, seed=args.seed,
    )
    result["config"]["mtp_acceptance"] = {"value": acceptance, "source": source}
    result["config"]["kernel_sources"] = _kernel_sources(profile)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    from disaggsdk.report.console import make_console
    from disaggsdk.sim.render import all_to_all_line, runs_table

    console = make_console()
    console.print(runs_table(result))
    if (line := all_to_all_line(result)) is not None:
        console.print(line)
    if acceptance:
        console.print(f"MTP first-draft acceptance {acceptance:.1%} ({source})")
    return 0


def _published(args: argparse.Namespace) -> int:
    """Simulate the published cases; 1 when a figure misses its published value (0 when every one holds).

    Raises:
        SpecError: a SPEC or a workload option beside --published (each case has its own), or an unknown NAME.
    """
    from disaggsdk.errors import SpecError
    from disaggsdk.sim.aiconfigurator_peer import find_command
    from disaggsdk.sim.published_run import run_published

    if args.spec is not None:
        raise SpecError(f"--published simulates the specs under specs/published/: drop {args.spec!r} (to name a "
                        f"case: --published NAME)")
    given = _options_given(args, ignore=("published", "json", "no_aiconfigurator"))
    if given:
        raise SpecError(f"--published simulates each case with the workload and settings its source states: drop "
                        f"{', '.join(given)}")
    name = None if args.published == ALL_PUBLISHED else args.published
    results = run_published(name, aiconfigurator=None if args.no_aiconfigurator else find_command())
    rows = [result.to_json() for result in results]
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        print()
    else:
        from disaggsdk.report.console import make_console
        from disaggsdk.sim.render import published_lines, published_table

        console = make_console()
        console.print(published_table(rows))
        for line in published_lines(rows):
            console.print(line, soft_wrap=True)
    return 0 if all(row["holds"] for row in rows) else 1


def _options_given(args: argparse.Namespace, ignore: tuple[str, ...]) -> list[str]:
    """The options of this command set to other than their defaults, as typed (``--request-rate``)."""
    fresh = argparse.ArgumentParser(add_help=False)
    add_arguments(fresh)
    seen, given = set(ignore), []
    for action in fresh._actions:  # an option's shown spelling comes before its hidden aliases (same dest)
        if not action.option_strings or action.dest in seen:
            continue
        seen.add(action.dest)
        if getattr(args, action.dest, action.default) != action.default:
            given.append(action.option_strings[0])
    return given


def _mtp_acceptance(text: str | None, spec) -> tuple[float, str]:
    """The acceptance to simulate with, and its source.

    Raises:
        SpecError: the spec drafts with mtp and no acceptance was given (a guess would be an assumption).
    """
    from disaggsdk.errors import SpecError
    from disaggsdk.sim.acceptance import read_acceptance

    if text is not None:
        return read_acceptance(text)
    if spec.speculative.method == "mtp":
        raise SpecError("the spec drafts with mtp: give --mtp-acceptance, measured (a `disaggsdk bench SPEC "
                        "--output FILE` JSON of a run with it) or a number in [0, 1]")
    return 0.0, "off"


def _with_kernels(profile, option: str | None):
    """``profile`` with the kernel tables ``--kernels`` names (None: as it is).

    Raises:
        SpecError: a malformed value, or tables asked of a profile that is no GPU the tables cover.
    """
    import attrs

    from disaggsdk.errors import SpecError
    from disaggsdk.sim.kernel_db import SYSTEMS, KernelDbRef

    if option is None:
        return profile
    ref = KernelDbRef.from_option(option, profile.name)
    if ref is not None and profile.name not in SYSTEMS:
        raise SpecError(f"--kernels {option}: profile {profile.name} is no GPU the kernel tables cover "
                        f"({', '.join(SYSTEMS)}); leave --kernels out")
    return attrs.evolve(profile, kernel_db=ref)


def _kernel_sources(profile) -> dict[str, str]:
    """Kernel kind -> where the run's step times came from (the JSON's ``config.kernel_sources``)."""
    if profile.kernel_db is None:
        return {"step": f"block roofline of profile {profile.name} (sim.cost_model)"}
    from disaggsdk.sim.simulator import gpu_kernel_costs

    return dict(gpu_kernel_costs(profile).sources())


def _validate(args: argparse.Namespace, spec, profile) -> int:
    from disaggsdk.calibrate.validate import TOLERANCE, validate
    from disaggsdk.errors import SpecError
    from disaggsdk.face.deployment import launch

    if spec.device != "cpu":
        raise SpecError(f"--validate runs the spec on this machine: use a CPU spec such as specs/tiny_local.yaml, "
                        f"not a {spec.device} one")
    if args.repeat < 1:
        raise SpecError(f"--repeat: expected a count of at least 1, got {args.repeat}")
    rows = validate(spec, profile, _rates(args.request_rate), args.num_prompts, args.input_len, args.output_len,
                    args.range_ratio, args.seed, repeat=args.repeat, correct_speed=not args.no_speed_correction,
                    launch=launch)
    if args.json:
        json.dump({"profile": profile.name, "tolerance": TOLERANCE, "rows": rows}, sys.stdout, indent=2)
        print()
    else:
        from rich.table import Table

        from disaggsdk.report.console import make_console

        medians = f", medians of {args.repeat} runs" if args.repeat > 1 else ""
        table = Table(title=f"mean TTFT and TPOT (ms), measured vs simulated on {profile.name}{medians}: {spec.label}")
        for col in ("layout", "qps", "slower", "TTFT", "sim", "err", "TPOT", "sim", "err", f"±{TOLERANCE:.0%}"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in rows:
            t, p = r["mean_ttft_ms"], r["mean_tpot_ms"]
            table.add_row("disagg" if r["layout"] == "disaggregated" else "coloc", f"{r['qps']:g}",
                          f"{r['decode_speed_factor']:.2f}/{r['prefill_speed_factor']:.2f}",
                          f"{t['measured']:.1f}", f"{t['simulated']:.1f}", f"{t['error']:+.0%}",
                          f"{p['measured']:.2f}", f"{p['simulated']:.2f}", f"{p['error']:+.0%}",
                          "yes" if r["within_tolerance"] else "no")
        console = make_console()
        console.print(table)
        if rows and rows[0]["speed_corrected"]:
            console.print("slower: the speed monitor's decode step / prefill CPU time during the runs over its time "
                          "at calibration (medians of the runs); each run is simulated re-timed to its own (--json "
                          "also has every run simulated as calibrated; --no-speed-correction compares with that).")
        elif not args.no_speed_correction:
            console.print("this profile records no calibration speed (monitor_*): rerun `disaggsdk calibrate` "
                          "to correct for drift")
    return 0 if all(r["within_tolerance"] for r in rows) else 1
