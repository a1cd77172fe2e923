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
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console

from disaggsdk.cli import bench_args
from disaggsdk.cli.bench_args import BenchArgsError, add_load_arguments
from disaggsdk.cli.runtime_options import add_runtime_options
from disaggsdk.report.console import make_console

if TYPE_CHECKING:
    from disaggsdk.bench.dataset import BenchRequest
    from disaggsdk.bench.multi_turn import MultiTurnWorkload
    from disaggsdk.engine.tokenizer import Tokenizer
    from disaggsdk.face.deployment import Deployment

HELP = "Benchmark an OpenAI-compatible server (URL) or a spec (launch, load, tear down); vLLM's flags and keys."
API_KEY_ENV = "DISAGGSDK_API_KEY"
REPEAT_KEY = "p99_itl_ms"  # --repeat reports the run with the median of this
RATIO_KEYS = ("p99_itl_ms", "median_itl_ms", "mean_ttft_ms", "output_throughput")  # printed for --compare

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `bench`."""
    parser.add_argument("target", nargs="?", default=None,
                        help="server URL (http://host:port) or a spec file to launch (or --base-url)")
    parser.add_argument("--base-url", default=None, metavar="URL", help="the server, as vLLM spells it")
    parser.add_argument("--model", default=None, help="model to ask for (default: the server's first)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"bearer token (default: env {API_KEY_ENV})")
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
             deployment: Deployment | None = None, title: str = "benchmark") -> dict[str, Any]:
    """Run the load against ``url`` with a progress bar (and, for a deployment, the live instance table)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from disaggsdk.bench.serve_bench import bench, conversations_of, served_model
    from disaggsdk.bench.serve_request import RequestOptions
    from disaggsdk.report.live_table import LiveView, instance_table

    options = RequestOptions(bench_args.endpoint(args), args.temperature, args.ignore_eos)
    slos_ms, percentiles = bench_args.slos_ms(args), bench_args.percentiles(args)
    percentile_metrics = bench_args.percentile_metrics(args)
    model = model or served_model(url, api_key)
    requests = load_requests(args, model, options.chat)
    shape = bench_args.load_shape(args)
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
                       tokenizer_id=args.tokenizer or model, on_start=load_started)
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
    for path in paths:
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
        for path in paths:
            console.print(f"results written to {path}")
    if len(results) == 2:
        (name_a, a), (name_b, b) = results
        ratios = ", ".join(f"{key} {a[key] / b[key]:.2f}" for key in RATIO_KEYS if b.get(key))
        make_console(stderr=True).print(f"{name_a} / {name_b}: {ratios}", soft_wrap=True)


def _target(args: argparse.Namespace) -> str:
    if args.target and args.base_url and args.target.rstrip("/") != args.base_url.rstrip("/"):
        raise BenchArgsError(f"two targets: {args.target} and --base-url {args.base_url}; give one")
    target = args.target or args.base_url
    if not target:
        raise BenchArgsError("give a server URL or a SPEC to launch (or --base-url URL)")
    if args.base_url and not args.base_url.startswith(("http://", "https://")):
        raise BenchArgsError(f"--base-url {args.base_url}: expected http://host:port")
    return target


def _check_options(args: argparse.Namespace) -> None:
    """Raise BenchArgsError (or BenchError, DatasetError) for options that cannot work, before anything starts."""
    bench_args.endpoint(args)
    if bench_args.dataset_name(args) == "multi-turn":
        bench_args.multi_turn_shape(args)
    bench_args.load_shape(args)
    bench_args.slos_ms(args)
    if args.repeat > 1 and (99 not in bench_args.percentiles(args) or "itl" not in bench_args.percentile_metrics(args)):
        raise BenchArgsError(f"--repeat picks the run by {REPEAT_KEY}: keep 99 in --metric-percentiles and itl in "
                             f"--percentile-metrics")
    bench_args.percentiles(args)
    bench_args.percentile_metrics(args)


def run(args: argparse.Namespace) -> int:
    """Benchmark a URL, or launch a spec (once, or twice with --compare), load it and tear it down.

    Returns:
        0 on success.
    Raises:
        DisaggError: bad options, an unreachable server, or a spec that cannot be launched.
    """
    target = _target(args)
    _check_options(args)  # before a spec's minute of start-up
    console = make_console(stderr=args.json)
    if target.startswith(("http://", "https://")):
        if args.tiny or args.colocated or args.compare:
            raise BenchArgsError("--tiny, --colocated and --compare apply to a SPEC, not to a URL")
        result = run_load(args, console, target.rstrip("/"), args.model, args.api_key)
        report(args, console, [(target, result)])
        return 0
    from disaggsdk.bench.serve_bench import median_run
    from disaggsdk.cli.launch_cmd import launch_spec

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
