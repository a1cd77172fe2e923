"""`disaggsdk bench URL|SPEC`: load a server (or a deployment it launches) and report vLLM-style results.

The options are `vllm bench serve`'s where it has them (`cli.bench_args`). The disaggregation
comparison on a 2-core machine (prefill and decode each pinned to one core against two colocated
instances each pinned to one core; run it on an otherwise idle machine):

    disaggsdk bench specs/tiny_pd.yaml --compare --repeat 3 --input-len 1024 --output-len 128 \
        --num-prompts 40 --request-rate 1.5 --metric-percentiles 50,99,99.9
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from disaggsdk.bench.goodput_sweep import RateSweep, goodput_line
from disaggsdk.bench.multi_turn import MultiTurnWorkload
from disaggsdk.cli import bench_args
from disaggsdk.cli.bench_args import BenchArgsError, add_load_arguments
from disaggsdk.cli.options import add_api_key_option
from disaggsdk.cli.path_options import writing
from disaggsdk.cli.runtime_options import add_runtime_options
from disaggsdk.records.goodput_records import GoodputSweep
from disaggsdk.report.console import make_console

if TYPE_CHECKING:
    from disaggsdk.bench.dataset import BenchRequest
    from disaggsdk.bench.serve_bench import BenchResult
    from disaggsdk.bench.turn_summary import TurnSummary
    from disaggsdk.engine.tokenizer import Tokenizer
    from disaggsdk.face.deployment import Deployment

HELP = "Benchmark an OpenAI-compatible server (URL) or a spec (launch, load, tear down); vLLM's flags and keys."
REPEAT_KEY = "p99_itl_ms"  # --repeat reports the run with the median of this
RATIO_KEYS = ("p99_itl_ms", "median_itl_ms", "mean_ttft_ms", "output_throughput")  # printed for --compare
AGENT_TRACE_TEST_PROMPT_LEN = 32  # random ids: shares no page with the trace's prompts

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `bench`."""
    parser.add_argument("targets", nargs="*", default=[], metavar="TARGET",
                        help="server URL (http://host:port) or a spec file to launch (or --base-url); several are "
                             "loaded one after the other with the same prompts and reported side by side")
    parser.add_argument("--base-url", default=None, metavar="URL", help="the server, as vLLM spells it")
    parser.add_argument("--model", default=None, help="model to ask for (default: the server's first)")
    add_api_key_option(parser)
    parser.add_argument("--tiny", action="store_true", help="SPEC: run with the tiny variant of its model on CPU")
    parser.add_argument("--colocated", action="store_true", help="SPEC: benchmark the colocated layout instead")
    add_runtime_options(parser, with_backend=False)  # --backend is among the load options
    parser.add_argument("--compare", action="store_true",
                        help="SPEC: the same load disaggregated, then colocated (every instance mixed), each unit "
                             "pinned to one core (unit i on core i mod cores): the same CPU budget, side by side")
    parser.add_argument("--no-live", action="store_true", help="SPEC: no live instance table, only a progress bar")
    parser.add_argument("--repeat", type=int, default=1,
                        help=f"SPEC: run each layout N times (alternating) and report the run with the median "
                             f"{REPEAT_KEY}, for noisy machines")
    add_load_arguments(parser)


def load_requests(args: argparse.Namespace, model: str | None,
                  chat: bool = False) -> list[BenchRequest] | MultiTurnWorkload:
    """The benchmark's requests (or multi-turn conversations) from the load options.

    Random prompts are token ids; for the chat endpoint they become text of the same length in the
    tokenizer (the server's usage then gives the real prompt length, chat template included).

    Raises:
        DisaggError: bad dataset options, or no tokenizer where one is needed.
    """
    from disaggsdk.bench.dataset import BenchRequest, random_requests, sharegpt_requests
    from disaggsdk.bench.multi_turn import sharegpt_conversations, synthetic_conversations

    name = bench_args.dataset_name(args)
    if name == "agent-trace":
        from disaggsdk.bench.agent_trace import agent_trace_workload

        return agent_trace_workload(args.dataset_path, args.num_prompts if args.num_prompts_given else None,
                                    args.multi_turn_turns if args.multi_turn_turns_given else None, args.output_len)
    if name == "custom":
        from disaggsdk.bench.trace_dataset import trace_lengths, trace_requests

        needs_tokenizer = chat or any(n is None for n, _ in trace_lengths(args.dataset_path))
        tokenizer_or_none = _tokenizer(args.tokenizer or model) if needs_tokenizer else None
        traced = trace_requests(args.dataset_path, args.num_prompts,
                                (lambda text: len(tokenizer_or_none.encode(text))) if tokenizer_or_none else None,
                                args.output_len, args.seed)
        if not chat or tokenizer_or_none is None:
            return traced
        as_text = [(r.prompt, r.prompt_len) if isinstance(r.prompt, str)
                   else _text_of_length(tokenizer_or_none, list(r.prompt)) for r in traced]
        return [BenchRequest(text, n, r.output_len) for (text, n), r in zip(as_text, traced)]
    if name == "multi-turn":
        shape = bench_args.multi_turn_shape(args)
        if not args.dataset_path:
            return synthetic_conversations(args.num_prompts, shape, args.seed)
    if name == "random":
        output_len = args.output_len or bench_args.DEFAULT_OUTPUT_LEN
        requests = random_requests(args.num_prompts, args.input_len, output_len, args.range_ratio, args.seed)
        if not chat:
            return requests
    tokenizer = _tokenizer(args.tokenizer or model)
    if name == "random":
        texts = [_text_of_length(tokenizer, _token_ids(r.prompt)) for r in requests]
        return [BenchRequest(text, n, r.output_len) for (text, n), r in zip(texts, requests)]
    count = lambda text: len(tokenizer.encode(text))  # noqa: E731
    if name == "multi-turn":
        return sharegpt_conversations(args.dataset_path, args.num_prompts, count, shape.turns, args.output_len,
                                      args.seed)
    return sharegpt_requests(args.dataset_path, args.num_prompts, count, args.output_len, args.seed)


def _token_ids(prompt: str | list[int]) -> list[int]:
    """A random dataset's prompt: its token ids (a copy)."""
    assert not isinstance(prompt, str), "random prompts are token ids"
    return list(prompt)


def _text_of_length(tokenizer: Tokenizer, ids: list[int], rounds: int = 4) -> tuple[str, int]:
    """Text that encodes to about ``len(ids)`` tokens, and its length: random ids decode to text
    that re-encodes longer (vLLM trims the same way), so cut the re-encoded ids and decode again."""
    text = tokenizer.decode(ids)
    for _ in range(rounds):
        encoded = tokenizer.encode(text)
        if len(encoded) <= len(ids):
            return text, len(encoded)
        text = tokenizer.decode(encoded[:len(ids)])
    return text, len(tokenizer.encode(text))


def _tokenizer(model: str | None) -> Tokenizer:
    from disaggsdk.engine.tokenizer import ByteTokenizer, load_tokenizer

    # a full-size catalog model has no tokenizer here (None): byte-level ids are valid for every model
    return (load_tokenizer(model) if model else None) or ByteTokenizer()


def run_load(args: argparse.Namespace, console: Console, url: str, model: str | None, api_key: str | None,
             deployment: Deployment | None = None, title: str = "benchmark", rate: float | None = None,
             seed: int | None = None) -> BenchResult:
    """Run the load against ``url`` with a progress bar (and, for a deployment, the live instance table).

    Args:
        rate, seed: one run of a goodput sweep: its rate, and the seed of its own prompts (the test
            request is then drawn from ``--seed``, so no measured prompt was sent before it is measured).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from disaggsdk.bench.dataset import random_requests
    from disaggsdk.bench.serve_bench import bench, conversations_of, served_model
    from disaggsdk.bench.serve_request import RequestOptions
    from disaggsdk.report.live_table import LiveView, instance_table

    agent_trace = bench_args.dataset_name(args) == "agent-trace"
    # an agent trace's runs are compared token for token (tiers on and off): ask for the output ids
    options = RequestOptions(bench_args.endpoint(args), args.temperature, args.ignore_eos,
                             return_token_ids=agent_trace)
    slos_ms, percentiles = bench_args.slos_ms(args), bench_args.percentiles(args)
    percentile_metrics = bench_args.percentile_metrics(args)
    model = model or served_model(url, api_key)
    requests = load_requests(args if seed is None else argparse.Namespace(**{**vars(args), "seed": seed}), model,
                             options.chat)
    warmup: BenchRequest | None = None
    if agent_trace:
        # no prompt of the trace may be cached before it is measured: the test request is other tokens
        warmup = random_requests(1, AGENT_TRACE_TEST_PROMPT_LEN, 4, seed=args.seed)[0]
    elif seed is not None and not isinstance(requests, MultiTurnWorkload):
        # (a multi-turn load's test request puts the shared system prompt in the cache on purpose)
        drawn = load_requests(argparse.Namespace(**{**vars(args), "num_prompts": 1}), model, options.chat)
        warmup = drawn[0] if not isinstance(drawn, MultiTurnWorkload) else None
    shape = bench_args.load_shape(args, rate, seed)
    progress = Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=console)
    task = progress.add_task("requests", total=sum(map(len, conversations_of(requests))))

    def render() -> Any:
        if deployment is None or getattr(args, "no_live", False):
            return progress
        return [progress, instance_table(deployment.metrics().rows, title=deployment.name)]

    started_s = [time.monotonic()]  # moved to the timed load's start, past the untimed test request

    def load_started() -> None:
        started_s[0] = time.monotonic()

    # (the speculative counters are read here, on this thread: the test request's drafts count too)
    spec_before = deployment.spec_stats() if deployment is not None else None
    with LiveView(render, console):
        result = bench(url, requests, shape, model, api_key, slos_ms, on_done=lambda _: progress.advance(task),
                       percentiles=percentiles, options=options, percentile_metrics=percentile_metrics,
                       tokenizer_id=args.tokenizer or model, on_start=load_started,
                       warmup=warmup)
    phases = deployment.ttft_phases(started_s[0]) if deployment is not None else None
    if phases and phases["requests"]:
        # the rest of the client's TTFT: HTTP, the server's text streaming, the client's parsing
        phases["mean_ms"]["http_and_client"] = result["mean_ttft_ms"] - phases["mean_ms"]["server_ttft"]
        result["ttft_phases"] = phases
    if spec_before is not None and deployment is not None:
        drafted = deployment.spec_stats()
        drafted.subtract(spec_before)
        if drafted.num_drafts:  # this run's drafts: acceptance rate, per position, mean accepted length
            result["speculative"] = drafted.to_json()
    return result


def report(args: argparse.Namespace, console: Console, results: list[tuple[str, dict[str, Any]]]) -> None:
    """Print the summary table (and JSON where asked); write ``--output`` and ``--save-result``'s file."""
    from disaggsdk.report.live_table import summary_table

    doc: Any = results[0][1] if len(results) == 1 else {name: r for name, r in results}
    paths = bench_args.result_paths(args, results[0][1])
    for option, path in paths:
        with writing(option, path):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        make_console(stderr=True).print(summary_table(results))
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
            if r.get("multi_turn"):
                mt, cached = r["multi_turn"], r.get("cached_token_ratio")
                served = f"; the server's cache served {cached:.0%} of the prompt tokens" if cached is not None else ""
                console.print(f"{name}: {mt['conversations']} conversations; earlier prompts held "
                              f"{mt['prefix_reuse_ratio']:.0%} of the prompt {mt['prefix_reuse_unit']}{served}")
                console.print(f"{name}: {turn_line(mt)}")
        for _option, path in paths:
            console.print(f"results written to {path}")
    if len(results) == 2:
        (name_a, a), (name_b, b) = results
        ratios = ", ".join(f"{key} {a[key] / b[key]:.2f}" for key in RATIO_KEYS if b.get(key))
        make_console(stderr=True).print(f"{name_a} / {name_b}: {ratios}", soft_wrap=True)


def turn_line(multi_turn: TurnSummary) -> str:
    """A multi-turn run by turn in one line: mean TTFT of turn 1 and of later turns, the hit rate."""
    def ms(value: float | None) -> str:
        return f"{value:.1f} ms" if value is not None else "-"

    hits = multi_turn["hit_rate"]
    served = (f"; the cache served {hits:.0%} of the {multi_turn['reusable_tokens']:,} reusable prompt tokens"
              if hits is not None else "")
    return (f"mean TTFT turn 1 {ms(multi_turn['mean_ttft_turn1_ms'])}, turns 2+ "
            f"{ms(multi_turn['mean_ttft_turns2plus_ms'])}{served}")


def _targets(args: argparse.Namespace) -> list[str]:
    targets = list(args.targets)
    if args.base_url:
        if not args.base_url.startswith(("http://", "https://")):
            raise BenchArgsError(f"--base-url {args.base_url}: expected http://host:port")
        if args.base_url.rstrip("/") not in [t.rstrip("/") for t in targets]:
            targets.append(args.base_url)
    if not targets:
        raise BenchArgsError("give a server URL or a SPEC to launch (or --base-url URL)")
    if len(set(targets)) < len(targets):
        raise BenchArgsError(f"a target is given twice: {' '.join(targets)}")
    return targets


def _is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def _check_options(args: argparse.Namespace, targets: list[str]) -> None:
    """Raise BenchArgsError (or BenchError, DatasetError, SweepError) for options that cannot work,
    before anything starts."""
    bench_args.endpoint(args)
    if bench_args.dataset_name(args) == "multi-turn":
        bench_args.multi_turn_shape(args)
    if bench_args.dataset_name(args) == "agent-trace":
        load_requests(args, None)  # a trace that cannot be read fails before a spec's start-up
    sweep = bench_args.rate_sweep(args)
    rates = bench_args.request_rates(args)
    bench_args.load_shape(args, rates[0] if rates else 1.0)
    slos = bench_args.slos_ms(args)
    if sweep is not None and not slos:
        raise BenchArgsError(f"--request-rate {args.request_rate} sweeps for the goodput rate: give the SLOs it "
                             f"must meet, e.g. --goodput ttft:2000 tpot:100 (ms)")
    if args.repeat < 1:
        raise BenchArgsError(f"--repeat must be >= 1, got {args.repeat}")
    if sweep is None and args.repeat > 1 and (99 not in bench_args.percentiles(args)
                                              or "itl" not in bench_args.percentile_metrics(args)):
        raise BenchArgsError(f"--repeat picks the run by {REPEAT_KEY}: keep 99 in --metric-percentiles and itl in "
                             f"--percentile-metrics")
    bench_args.percentiles(args)
    bench_args.percentile_metrics(args)
    bench_args.check_result_filename(args)
    if any(_is_url(t) for t in targets) and (args.tiny or args.colocated or args.compare) \
            and all(_is_url(t) for t in targets):
        raise BenchArgsError("--tiny, --colocated and --compare apply to a SPEC, not to a URL")


def _spec_args(args: argparse.Namespace, spec_path: str) -> argparse.Namespace:
    """``args`` as `launch_cmd.launch_spec` reads them for one spec target."""
    return argparse.Namespace(**{**vars(args), "target": spec_path})


def _sweep(args: argparse.Namespace, console: Console, sweep: RateSweep, name: str, url: str, model: str | None,
           api_key: str | None, deployment: Deployment | None = None) -> GoodputSweep:
    """Every run of ``sweep`` against one server; its goodput document (`goodput_sweep.run_sweep`)."""
    from disaggsdk.bench.goodput_sweep import run_sweep
    from disaggsdk.records.host_cpu import host_cpu

    def run_at(rate: float, seed: int) -> BenchResult:
        label = "inf" if math.isinf(rate) else f"{rate:.3g}"
        return run_load(args, console, url, model, api_key, deployment, f"{name} @ {label} req/s", rate, seed)

    doc = run_sweep(run_at, sweep, bench_args.slos_ms(args), args.seed)
    console.print(goodput_line(name, doc))
    doc["target"], doc["cpu"] = name, host_cpu().as_json()
    return doc


def _report_sweeps(args: argparse.Namespace, console: Console, docs: list[tuple[str, GoodputSweep]]) -> None:
    """Each sweep's runs as a table, the goodput rates side by side, and the JSON where asked."""
    from rich.table import Table

    doc: GoodputSweep | dict[str, GoodputSweep] = docs[0][1] if len(docs) == 1 else {name: d for name, d in docs}
    out = make_console(stderr=True) if args.json else console
    for name, d in docs:
        table = Table(title=f"{name}: SLO attainment by rate ({', '.join(f'{k} {v:g} ms' for k, v in d['slos_ms'].items())})")
        for col in ("round", "rate req/s", "attainment", "goodput req/s", "done req/s", "p99 TTFT ms",
                    "median TPOT ms"):
            table.add_column(col, justify="right")
        for row in d["sweep"]:
            rate = row["request_rate"]
            table.add_row(str(row["round"] + 1), rate if isinstance(rate, str) else f"{rate:.2f}",
                          f"{row['slo_attainment']:.0%}",
                          f"{row['request_goodput']:.2f}", f"{row['request_throughput']:.2f}",
                          f"{row['p99_ttft_ms']:.0f}" if row.get("p99_ttft_ms") is not None else "-",
                          f"{row['median_tpot_ms']:.1f}" if row.get("median_tpot_ms") is not None else "-")
        out.print(table)
    for name, d in docs:
        out.print(goodput_line(name, d))
    if len(docs) == 2 and docs[1][1]["goodput_request_rate"] > 0:
        (name_a, a), (name_b, b) = docs
        out.print(f"goodput {name_a} / {name_b}: {a['goodput_request_rate'] / b['goodput_request_rate']:.2f}")
    if args.output:
        with writing("--output", args.output):
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(json.dumps(doc, indent=2) + "\n")
        out.print(f"results written to {args.output}")
    if args.json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")


def run(args: argparse.Namespace) -> int:
    """Benchmark URLs and specs (each spec launched once, or twice with --compare, loaded and torn
    down), one after the other; with a list of rates or ``search``, sweep each for its goodput rate.

    Returns:
        0 on success.
    Raises:
        DisaggError: bad options, an unreachable server, or a spec that cannot be launched.
    """
    from disaggsdk.bench.serve_bench import median_run
    from disaggsdk.cli.launch_cmd import launch_spec, wait_for_compiled_steps

    targets = _targets(args)
    _check_options(args, targets)  # before a spec's minute of start-up
    sweep = bench_args.rate_sweep(args)
    console = make_console(stderr=args.json)
    layouts = [False, True] if args.compare else [args.colocated]
    runs: dict[str, list[dict[str, Any]]] = {}
    sweeps: list[tuple[str, GoodputSweep]] = []
    # a sweep runs every round on one launch; plain runs alternate layouts across --repeat launches,
    # so a noisy minute hurts both alike
    repeats = 1 if sweep is not None else args.repeat
    for i in range(repeats):
        for target in targets:
            if _is_url(target):
                url = target.rstrip("/")
                if sweep is not None:
                    sweeps.append((url, _sweep(args, console, sweep, url, url, args.model, args.api_key)))
                else:
                    title = f"{url} {i + 1}/{repeats}" if repeats > 1 else url
                    runs.setdefault(url, []).append(run_load(args, console, url, args.model, args.api_key,
                                                             title=title))
                continue
            for colocated in layouts:
                name = ("colocated" if colocated else "disaggregated") + (f" {target}" if len(targets) > 1 else "")
                title = f"{name} {i + 1}/{repeats}" if repeats > 1 else name
                with launch_spec(_spec_args(args, target), console, colocated=colocated, port=0,
                                 pin=args.compare) as d:
                    wait_for_compiled_steps(d, console)
                    if sweep is not None:
                        sweeps.append((name, _sweep(args, console, sweep, name, d.url, d.model_name, d.api_key, d)))
                    else:
                        runs.setdefault(name, []).append(run_load(args, console, d.url, d.model_name, d.api_key, d,
                                                                  title))
    if sweep is not None:
        _report_sweeps(args, console, sweeps)
        return 0
    results = [(name, median_run(rs, REPEAT_KEY) if len(rs) > 1 else rs[0]) for name, rs in runs.items()]
    if repeats > 1:
        for name, rs in runs.items():
            values = ", ".join(f"{r[REPEAT_KEY]:.1f}" for r in rs)
            console.print(f"{name}: {REPEAT_KEY} of each run: {values}; reporting the median run")
    report(args, console, results)
    return 0
