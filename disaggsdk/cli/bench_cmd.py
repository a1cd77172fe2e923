"""`disaggsdk bench URL|SPEC`: load a server (or a deployment it launches) and report vLLM-style results.

The disaggregation comparison on a 2-core machine (prefill and decode each pinned to one core
against two colocated instances each pinned to one core; run it on an otherwise idle machine):

    disaggsdk bench specs/tiny_pd.yaml --compare --repeat 3 --input-len 1024 --output-len 128 \
        --num-prompts 40 --qps 1.5 --metric-percentiles 50,99,99.9
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from disaggsdk.errors import DisaggError

if TYPE_CHECKING:
    from disaggsdk.bench.dataset import BenchRequest
    from disaggsdk.face.deployment import Deployment

HELP = "Benchmark an OpenAI-compatible server (URL) or a spec (launch, load, tear down); vLLM field names."
API_KEY_ENV = "DISAGGSDK_API_KEY"
DEFAULT_OUTPUT_LEN = 64
REPEAT_KEY = "p99_itl_ms"  # --repeat reports the run with the median of this
RATIO_KEYS = ("p99_itl_ms", "median_itl_ms", "mean_ttft_ms", "output_throughput")  # printed for --compare


class BenchArgsError(DisaggError):
    """Command-line arguments of `bench` that cannot be used."""


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load options, shared with ``disaggsdk launch --bench``."""
    g = parser.add_argument_group("load")
    g.add_argument("--num-prompts", type=int, default=50, help="requests to send")
    g.add_argument("--qps", type=float, default=math.inf, help="mean arrival rate (Poisson); inf: all at once")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 Poisson, <1 burstier")
    g.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    g.add_argument("--input-len", type=int, default=256, help="prompt tokens (random dataset)")
    g.add_argument("--output-len", type=int, default=None,
                   help=f"output tokens (random dataset: default {DEFAULT_OUTPUT_LEN}; fixes ShareGPT's when given)")
    g.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in len*(1-r)..len*(1+r)")
    g.add_argument("--dataset", default=None, metavar="FILE", help="ShareGPT-format JSON instead of random prompts")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--slo", default=None, metavar="ttft=MS,tpot=MS", help="SLOs for goodput (milliseconds)")
    g.add_argument("--metric-percentiles", default="50,90,99", metavar="P,P", help="percentiles to report, e.g. 99,99.9")
    g.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    g.add_argument("--output", default=None, metavar="FILE", help="write the results as JSON to FILE")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `bench`."""
    parser.add_argument("target", help="server URL (http://host:port) or a spec file to launch")
    parser.add_argument("--model", default=None, help="model to ask for (default: the server's first)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), help=f"bearer token (env {API_KEY_ENV})")
    parser.add_argument("--tiny", action="store_true", help="SPEC: run with the tiny variant of its model on CPU")
    parser.add_argument("--colocated", action="store_true", help="SPEC: benchmark the colocated layout instead")
    parser.add_argument("--compare", action="store_true",
                        help="SPEC: the same load disaggregated, then colocated (every instance mixed), each unit "
                             "pinned to one core (unit i on core i mod cores): the same CPU budget, side by side")
    parser.add_argument("--no-live", action="store_true", help="SPEC: no live instance table, only a progress bar")
    parser.add_argument("--repeat", type=int, default=1,
                        help=f"SPEC: run each layout N times (alternating) and report the run with the median "
                             f"{REPEAT_KEY}, for noisy machines")
    add_load_arguments(parser)


def load_requests(args: argparse.Namespace, model: str | None) -> list[BenchRequest]:
    """The benchmark's requests from the load options."""
    from disaggsdk.bench.dataset import random_requests, sharegpt_requests

    if args.dataset is None:
        output_len = args.output_len or DEFAULT_OUTPUT_LEN
        return random_requests(args.num_prompts, args.input_len, output_len, args.range_ratio, args.seed)
    from disaggsdk.engine.tokenizer import ByteTokenizer, load_tokenizer

    tokenizer = (load_tokenizer(model) if model else None) or ByteTokenizer()
    count = lambda text: len(tokenizer.encode(text))  # noqa: E731
    return sharegpt_requests(args.dataset, args.num_prompts, count, args.output_len, args.seed)


def run_load(args: argparse.Namespace, console: Console, url: str, model: str | None, api_key: str | None,
             deployment: Deployment | None = None, title: str = "benchmark") -> dict[str, Any]:
    """Run the load against ``url`` with a progress bar (and, for a deployment, the live instance table)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from disaggsdk.bench.serve_bench import LoadShape, bench, parse_slos, served_model
    from disaggsdk.report.live import InstanceRow
    from disaggsdk.report.live_table import LiveView, instance_table

    model = model or served_model(url, api_key)
    requests = load_requests(args, model)
    shape = LoadShape(args.qps, args.burstiness, args.max_concurrency, args.seed)
    progress = Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console)
    task = progress.add_task("requests", total=len(requests))

    def render() -> Any:
        if deployment is None or getattr(args, "no_live", False):
            return progress
        rows = deployment.metrics()["instances"]
        return [progress, instance_table([InstanceRow(**r) for r in rows], title=deployment.name)]

    started_s = time.monotonic()
    spec_before = deployment.spec_stats() if deployment is not None else None
    with LiveView(render, console):
        result = bench(url, requests, shape, model, api_key, parse_slos(args.slo),
                       on_done=lambda _: progress.advance(task), percentiles=_percentiles(args.metric_percentiles))
    phases = deployment.ttft_phases(started_s) if deployment is not None else None
    if phases and phases["requests"]:
        # the rest of the client's TTFT: HTTP, the server's text streaming, the client's parsing
        phases["mean_ms"]["http_and_client"] = result["mean_ttft_ms"] - phases["mean_ms"]["server_ttft"]
        result["ttft_phases"] = phases
    if spec_before is not None:
        drafted = deployment.spec_stats()
        drafted.subtract(spec_before)
        if drafted.num_drafts:  # this run's drafts: acceptance rate, per position, mean accepted length
            result["speculative"] = drafted.to_json()
    return result


def _percentiles(text: str) -> list[float]:
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        values = []
    if not values or not all(0 < p <= 100 for p in values):
        raise BenchArgsError(f"--metric-percentiles {text!r}: give numbers in (0, 100], e.g. 50,99,99.9")
    return values


def report(args: argparse.Namespace, console: Console, results: list[tuple[str, dict[str, Any]]]) -> None:
    """Print the summary table (and JSON where asked); write ``--output``."""
    from disaggsdk.report.live_table import summary_table

    doc: Any = results[0][1] if len(results) == 1 else {name: r for name, r in results}
    if args.output:
        Path(args.output).write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        Console(stderr=True).print(summary_table(results))
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        console.print(summary_table(results))
        for name, r in results:
            if r.get("ttft_phases"):
                phases = " · ".join(f"{k} {v:.1f}" for k, v in r["ttft_phases"]["mean_ms"].items())
                console.print(f"{name}: mean TTFT by phase (ms): {phases}")
            if r.get("speculative"):
                sp = r["speculative"]
                per_pos = " ".join(f"{x:.0%}" for x in sp["per_position_acceptance"])
                console.print(f"{name}: speculative drafts accepted {sp['acceptance_rate']:.0%} (by position: "
                              f"{per_pos}), {sp['mean_accepted_length']:.2f} tokens per verify step")
        if args.output:
            console.print(f"results written to {args.output}")
    if len(results) == 2:
        (name_a, a), (name_b, b) = results
        ratios = ", ".join(f"{key} {a[key] / b[key]:.2f}" for key in RATIO_KEYS if b.get(key))
        Console(stderr=True).print(f"{name_a} / {name_b}: {ratios}", soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    """Benchmark a URL, or launch a spec (once, or twice with --compare), load it and tear it down.

    Returns:
        0 on success.
    Raises:
        DisaggError: bad options, an unreachable server, or a spec that cannot be launched.
    """
    console = Console(stderr=args.json)
    if args.target.startswith(("http://", "https://")):
        if args.tiny or args.colocated or args.compare:
            raise BenchArgsError("--tiny, --colocated and --compare apply to a SPEC, not to a URL")
        result = run_load(args, console, args.target.rstrip("/"), args.model, args.api_key)
        report(args, console, [(args.target, result)])
        return 0
    from disaggsdk.cli.launch_cmd import launch_spec

    from disaggsdk.bench.serve_bench import median_run

    if args.repeat < 1:
        raise BenchArgsError(f"--repeat must be >= 1, got {args.repeat}")
    layouts = [False, True] if args.compare else [args.colocated]
    runs: dict[str, list[dict[str, Any]]] = {}
    for i in range(args.repeat):  # layouts alternate, so a noisy minute hurts both alike
        for colocated in layouts:
            name = "colocated" if colocated else "disaggregated"
            title = f"{name} {i + 1}/{args.repeat}" if args.repeat > 1 else name
            with launch_spec(args, console, colocated=colocated, port=0, pin=args.compare) as d:
                runs.setdefault(name, []).append(run_load(args, console, d.url, d.model_name, d.api_key, d, title))
    results = [(name, median_run(rs, REPEAT_KEY)) for name, rs in runs.items()]
    if args.repeat > 1:
        for name, rs in runs.items():
            values = ", ".join(f"{r[REPEAT_KEY]:.1f}" for r in rs)
            console.print(f"{name}: {REPEAT_KEY} of each run: {values}; reporting the median run")
    report(args, console, results)
    return 0
