"""The load options of `disaggsdk bench` (and `launch --bench`), in ``vllm bench serve``'s spellings.

vLLM's flag is the primary name wherever vLLM has one for the same thing; ours stays beside it
(``--request-rate``/``--qps``, ``--random-input-len``/``--input-len``, ``--goodput``/``--slo``,
``--save-result``/``--output``...), so a ``vllm bench serve`` command line runs here unchanged
for the OpenAI backends. This module also turns the parsed options into what
`disaggsdk.bench.serve_bench.bench` takes.
"""

from __future__ import annotations

import argparse
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from disaggsdk.bench.goodput_sweep import DEFAULT_SEARCH_STEPS, DEFAULT_TARGET
from disaggsdk.cli.path_options import PathOption, check_path
from disaggsdk.errors import DisaggError
from disaggsdk.report.latency import METRICS

if TYPE_CHECKING:
    from disaggsdk.bench.goodput_sweep import RateSweep
    from disaggsdk.bench.multi_turn import MultiTurnShape
    from disaggsdk.bench.serve_bench import LoadShape

DEFAULT_OUTPUT_LEN = 64
DEFAULT_USER_LEN = 64  # multi-turn: each user message, unless --input-len is given
DATASETS = ("random", "sharegpt", "multi-turn", "custom", "agent-trace")
BACKENDS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}  # vLLM's --backend -> endpoint
RUNTIME_BACKENDS = ("local", "ray")  # --backend's other meaning: where a spec's units run (cli.runtime_options)


class BenchArgsError(DisaggError):
    """Command-line arguments of `bench` that cannot be used."""


class _StoreGiven(argparse.Action):
    """Store the value and set ``<dest>_given``: --input-len's default is the random dataset's prompt
    length, too long for one multi-turn user message, which then defaults to `DEFAULT_USER_LEN`; an
    agent trace replays all its sessions and turns unless --num-prompts or --multi-turn-turns is given."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    """The load, request, metric and output options, shared with ``disaggsdk launch --bench``."""
    g = parser.add_argument_group("load")
    g.add_argument("--num-prompts", type=int, default=50, action=_StoreGiven,
                   help="requests to send (multi-turn: conversations, each of --multi-turn-turns requests; "
                        "agent-trace: the trace's first N sessions, all unless given)")
    g.add_argument("--request-rate", "--qps", dest="request_rate", default="inf", metavar="RATE|R,R,...|search",
                   help="mean arrival rate in requests/s (Poisson); inf: all at once. bench only: a list (0.5,1,2) "
                        "sweeps the rates, `search` bisects for the highest rate meeting the SLOs; each reports "
                        "the goodput rate (needs --goodput)")
    g.add_argument("--goodput-target", type=float, default=DEFAULT_TARGET, metavar="SHARE",
                   help=f"a sweep's goodput rate is the highest at which this share of requests met every SLO "
                        f"(default {DEFAULT_TARGET})")
    g.add_argument("--search-steps", type=int, default=DEFAULT_SEARCH_STEPS,
                   help=f"bisections of --request-rate search (default {DEFAULT_SEARCH_STEPS}), after one run at "
                        f"rate inf that measures the most the server completes per second")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the gaps: 1 Poisson, <1 burstier")
    g.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    g.add_argument("--num-warmups", type=int, default=0,
                   help="untimed copies of the first request sent before the load (after vLLM's one test request)")
    g.add_argument("--dataset-name", choices=DATASETS, default=None,
                   help="random token ids, ShareGPT conversations from --dataset-path, multi-turn chats "
                        "that resend their history (synthetic token ids, or every turn of --dataset-path's "
                        "conversations), custom: a JSON-lines trace, one request a line "
                        "(bench/trace_dataset.py), or agent-trace: --dataset-path's agent sessions, one turn "
                        "a line, each turn resending the session's context (bench/agent_trace.py; shipped: "
                        "bench/traces/coding_agent_sessions.jsonl) (default: custom for a .jsonl path, sharegpt "
                        "for another path, else random)")
    g.add_argument("--dataset-path", "--dataset", dest="dataset_path", default=None, metavar="FILE",
                   action=PathOption, kind="input file",
                   help="ShareGPT-format JSON, or a JSON-lines trace (--dataset-name custom)")
    g.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, default=256,
                   action=_StoreGiven, help=f"prompt tokens of the random dataset (multi-turn: each user "
                                            f"message, {DEFAULT_USER_LEN} unless given)")
    parser.set_defaults(input_len_given=False, num_prompts_given=False, multi_turn_turns_given=False)
    g.add_argument("--output-len", "--random-output-len", dest="output_len", type=int, default=None,
                   help=f"output tokens (random and multi-turn: default {DEFAULT_OUTPUT_LEN}; fixes ShareGPT's "
                        f"when given)")
    g.add_argument("--range-ratio", "--random-range-ratio", dest="range_ratio", type=float, default=0.0,
                   help="lengths uniform in len*(1-r)..len*(1+r)")
    g.add_argument("--seed", type=int, default=0, help="seeds the prompts, their lengths and the arrival gaps")
    g.add_argument("--multi-turn-turns", type=int, default=4, action=_StoreGiven,
                   help="multi-turn: requests per conversation, each sent once the previous answer ended "
                        "(at most, for --dataset-path; agent-trace: each session's first N turns, all unless "
                        "given)")
    g.add_argument("--multi-turn-system-len", type=int, default=512,
                   help="multi-turn: tokens of the system prompt every synthetic conversation starts with")
    g.add_argument("--multi-turn-think-s", type=float, default=0.0,
                   help="multi-turn and agent-trace: seconds a user (an agent's tool) takes after an answer "
                        "before the next turn")
    r = parser.add_argument_group("requests")
    r.add_argument("--endpoint", choices=tuple(BACKENDS.values()), default=None,
                   help="API to load; chat sends one user message per prompt (default: --backend's, "
                        "else /v1/completions)")
    # one --backend for both meanings, their values disjoint: vLLM's client API, or where a SPEC's units run
    r.add_argument("--backend", choices=(*BACKENDS, *RUNTIME_BACKENDS), default=None,
                   help="openai | openai-chat: vLLM's name for the endpoint (openai-chat: /v1/chat/completions); "
                        "local | ray: where a SPEC's units run (default: the spec's launch.backend)")
    r.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature sent with every request (vLLM leaves it to the server)")
    r.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly the asked lengths (vLLM's flag; on here unless --no-ignore-eos)")
    r.add_argument("--tokenizer", default=None, metavar="MODEL",
                   help="catalog name or checkpoint directory that counts ShareGPT lengths and turns random "
                        "ids into chat text (default: the served model)")
    m = parser.add_argument_group("metrics")
    m.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS",
                   help="SLOs for goodput in vLLM's syntax, e.g. --goodput ttft:500 tpot:50 (ms)")
    m.add_argument("--slo", default=None, metavar="ttft=MS,tpot=MS", help="the same in our syntax")
    m.add_argument("--percentile-metrics", default=",".join(METRICS), metavar="M,M",
                   help="metrics whose percentiles are reported (mean and median are always)")
    m.add_argument("--metric-percentiles", default="50,90,99", metavar="P,P",
                   help="percentiles to report, e.g. 99,99.9")
    o = parser.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    o.add_argument("--output", default=None, metavar="FILE", action=PathOption, kind="output file",
                   help="write the results as JSON to FILE")
    o.add_argument("--save-result", action="store_true",
                   help="write the results as JSON to --result-dir/--result-filename (vLLM's naming)")
    o.add_argument("--result-dir", default=None, metavar="DIR", action=PathOption, kind="output dir",
                   help="folder for --save-result (default: the current one; implies --save-result)")
    o.add_argument("--result-filename", default=None, metavar="NAME",
                   help="file name for --save-result (default: vLLM's BACKEND-RATEqps-MODEL-DATE.json; "
                        "implies --save-result)")
    o.add_argument("--save-detailed", action="store_true",
                   help="accepted for vLLM: the per-request lists (ttfts, itls, ...) are always written")


def endpoint(args: argparse.Namespace) -> str:
    """The endpoint from ``--endpoint`` and ``--backend``.

    Raises:
        BenchArgsError: the two name different endpoints.
    """
    by_backend = BACKENDS.get(args.backend or "")
    if args.endpoint and by_backend and args.endpoint != by_backend:
        raise BenchArgsError(f"--backend {args.backend} sends to {by_backend}, not --endpoint {args.endpoint}")
    return args.endpoint or by_backend or BACKENDS["openai"]


def dataset_name(args: argparse.Namespace) -> str:
    """``random``, ``sharegpt``, ``multi-turn``, ``custom`` or ``agent-trace``, from ``--dataset-name``
    and ``--dataset-path``.

    Raises:
        BenchArgsError: sharegpt, custom or agent-trace without a path, a path for the random
            dataset, or token-id prompts (synthetic multi-turn, an agent trace) for the chat endpoint.
    """
    path = args.dataset_path
    name = args.dataset_name or ("random" if not path else "custom" if str(path).endswith(".jsonl") else "sharegpt")
    if name == "sharegpt" and not path:
        raise BenchArgsError("--dataset-name sharegpt needs --dataset-path FILE (a ShareGPT-format JSON)")
    if name == "custom" and not path:
        raise BenchArgsError("--dataset-name custom needs --dataset-path FILE (a JSON-lines trace)")
    if name == "agent-trace" and not path:
        raise BenchArgsError("--dataset-name agent-trace needs --dataset-path FILE (agent sessions, one turn a "
                             "line; shipped: disaggsdk/bench/traces/coding_agent_sessions.jsonl)")
    if name == "agent-trace" and endpoint(args) == BACKENDS["openai-chat"]:
        raise BenchArgsError("an agent trace's prompts are token ids, which /v1/chat/completions cannot take: "
                             "use /v1/completions")
    if name == "random" and args.dataset_path:
        raise BenchArgsError("--dataset-path is read by --dataset-name sharegpt, multi-turn or custom; the random dataset "
                             "has no file")
    if name == "multi-turn" and not args.dataset_path and endpoint(args) == BACKENDS["openai-chat"]:
        raise BenchArgsError("synthetic multi-turn prompts are token ids, which /v1/chat/completions cannot take: "
                             "use /v1/completions, or give --dataset-path FILE (ShareGPT multi-turn text)")
    return name


def multi_turn_shape(args: argparse.Namespace) -> MultiTurnShape:
    """The synthetic conversations of ``--dataset-name multi-turn``: ``--multi-turn-turns``,
    ``--multi-turn-system-len``, user messages of ``--input-len`` (`DEFAULT_USER_LEN` when not
    given) and replies of ``--output-len`` (`DEFAULT_OUTPUT_LEN`).

    Raises:
        DatasetError: a count or length out of range.
    """
    from disaggsdk.bench.multi_turn import MultiTurnShape

    user_len = args.input_len if args.input_len_given else DEFAULT_USER_LEN
    output_len = DEFAULT_OUTPUT_LEN if args.output_len is None else args.output_len
    return MultiTurnShape(args.multi_turn_turns, args.multi_turn_system_len, user_len, output_len)


def load_shape(args: argparse.Namespace, rate: float | None = None, seed: int | None = None) -> LoadShape:
    """The arrival process of the load options, with vLLM's untimed test request first.

    Args:
        rate, seed: one run of a sweep's (default: the one ``--request-rate``, ``--seed``).
    Raises:
        BenchError: a rate, burstiness, concurrency, warm-up count or think time out of range.
        BenchArgsError: no ``rate`` given and ``--request-rate`` asks for a sweep.
    """
    from disaggsdk.bench.serve_bench import LoadShape

    if rate is None:
        rates = request_rates(args)
        if rates is None or len(rates) > 1:
            raise BenchArgsError(f"--request-rate {args.request_rate} sweeps rates: `disaggsdk bench` runs sweeps; "
                                 "give one rate here")
        rate = rates[0]
    return LoadShape(rate, args.burstiness, args.max_concurrency, args.seed if seed is None else seed,
                     args.num_warmups, initial_test=True, think_time_s=args.multi_turn_think_s)


def request_rates(args: argparse.Namespace) -> tuple[float, ...] | None:
    """``--request-rate`` as rates (one, or a list to sweep), or None to search.

    Raises:
        SweepError: a value that is neither.
    """
    from disaggsdk.bench.goodput_sweep import parse_request_rates

    return parse_request_rates(str(args.request_rate))


def rate_sweep(args: argparse.Namespace) -> RateSweep | None:
    """The goodput sweep ``--request-rate`` asks for (a list or ``search``), or None for one rate.

    Raises:
        SweepError: bad rates, target or steps.
    """
    from disaggsdk.bench.goodput_sweep import RateSweep

    rates = request_rates(args)
    if rates is not None and len(rates) == 1:
        return None
    return RateSweep(tuple(sorted(rates)) if rates is not None else (), args.goodput_target, args.search_steps,
                     getattr(args, "repeat", 1))


def slos_ms(args: argparse.Namespace) -> dict[str, float]:
    """The SLOs of ``--goodput`` and ``--slo`` together (milliseconds).

    Raises:
        BenchError: a malformed entry.
    """
    from disaggsdk.bench.serve_bench import parse_goodput, parse_slos

    return parse_goodput(args.goodput) | parse_slos(args.slo)


def percentiles(args: argparse.Namespace) -> list[float]:
    """``--metric-percentiles`` as numbers.

    Raises:
        BenchArgsError: a value that is not a number in (0, 100].
    """
    text = args.metric_percentiles
    try:
        values = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        values = []
    if not values or not all(0 < p <= 100 for p in values):
        raise BenchArgsError(f"--metric-percentiles {text!r}: give numbers in (0, 100], e.g. 50,99,99.9")
    return values


def percentile_metrics(args: argparse.Namespace) -> list[str]:
    """``--percentile-metrics`` as names.

    Raises:
        BenchArgsError: a name outside ttft, tpot, itl, e2el.
    """
    names = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    unknown = [m for m in names if m not in METRICS]
    if not names or unknown:
        raise BenchArgsError(f"--percentile-metrics {args.percentile_metrics!r}: choose among {','.join(METRICS)}")
    return names


def result_paths(args: argparse.Namespace, result: dict[str, Any]) -> list[tuple[str, Path]]:
    """Where to write ``result``, each with the option that named it: ``--output``, and vLLM's
    ``--result-dir/--result-filename`` when saving.

    Args:
        result: the (first) run's result, whose backend, rate and model name vLLM's file name.
    """
    from disaggsdk.bench.serve_result import result_filename

    paths = [("--output", Path(args.output))] if args.output else []
    if args.save_result or args.result_dir or args.result_filename:
        name = args.result_filename or result_filename(
            result["backend"], float(result["request_rate"]), args.max_concurrency, result["model_id"],
            result.get("date") or datetime.now().strftime("%Y%m%d-%H%M%S"))
        paths.append(("--result-dir" if args.result_dir else "--save-result", Path(args.result_dir or ".") / name))
    return paths


def check_result_filename(args: argparse.Namespace) -> None:
    """Check ``--result-filename`` in ``--result-dir`` before a run (the other paths are checked as `PathOption` arguments).

    Raises:
        PathOptionError: the file cannot be written.
    """
    if args.result_filename:
        check_path("--result-filename", str(Path(args.result_dir or ".") / args.result_filename), "output file")
