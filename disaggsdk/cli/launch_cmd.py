"""`disaggsdk launch SPEC` (or ``--model M --device cpu --decoders 2``: cli.one_line_spec): start a deployment on
this machine and serve it until Ctrl-C / SIGTERM.

With ``--bench`` it runs a benchmark with the live view instead, prints the summary and shuts down
(what ``make demo`` does).
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from disaggsdk.cli import bench_args
from disaggsdk.cli.bench_args import add_load_arguments
from disaggsdk.cli.bench_cmd import report, run_load
from disaggsdk.cli.one_line_spec import add_one_line_arguments, spec_of_args
from disaggsdk.cli.options import add_api_key_option
from disaggsdk.cli.path_options import PathOption
from disaggsdk.cli.runtime_options import add_runtime_options, with_runtime_options
from disaggsdk.report.console import make_console

if TYPE_CHECKING:
    from disaggsdk.face.deployment import Deployment
    from disaggsdk.spec.types import Spec

HELP = "Launch a spec's processes on this machine behind an OpenAI-compatible server (live TTFT/TPS)."
POLL_S = 0.25


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `launch`."""
    parser.add_argument("target", metavar="SPEC", nargs="?", default=None,
                        help="deployment spec (YAML); or describe one with --model and the flags below")
    add_one_line_arguments(parser)
    parser.add_argument("--tiny", action="store_true", help="same topology with the tiny variant of the model, on CPU")
    parser.add_argument("--colocated", action="store_true",
                        help="the comparison layout: mixed prefill+decode instances on the same CPU budget")
    parser.add_argument("--host", default=None, help="interface to bind (default: the spec's serve.host)")
    parser.add_argument("--port", type=int, default=None, help="port (default: the spec's serve.port; 0: any free)")
    add_api_key_option(parser, "require this bearer token")
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the model name clients send and /v1/models lists (default: the spec's serve.model_name, "
                             "else its model)")
    parser.add_argument("--allowed-origins", nargs="*", default=[], metavar="ORIGIN",
                        help="web origins whose pages may call the server (CORS); '*' for any")
    add_runtime_options(parser, with_backend=False)  # --backend is among the load options
    parser.add_argument("--log-dir", default=None, action=PathOption, kind="output dir",
                        help="where rank processes write their logs")
    parser.add_argument("--max-restarts", type=int, default=None, metavar="N",
                        help="restart a unit that dies up to N times within the restart window (default: 3; 0: never)")
    parser.add_argument("--restart-window-s", type=float, default=None, metavar="S",
                        help="how long a restart counts against --max-restarts (default: 600)")
    parser.add_argument("--no-live", action="store_true", help="no live instance table")
    parser.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                        help="trace every request as OpenTelemetry spans sent over OTLP/HTTP to URL (vLLM's flag; "
                             "sets serve.otlp_traces_endpoint; docs/tracing.md), e.g. http://localhost:4318/v1/traces")
    parser.add_argument("--access-log", action="store_true",
                        help="one line per finished request on stdout: status, tokens, TTFT, total time, the prefill "
                             "and decode instance (the spec's serve.http.access_log)")
    parser.add_argument("--bench", action="store_true", help="run a benchmark (load options below), print it, shut down")
    parser.add_argument("--complete", action="append", default=[], metavar="TEXT",
                        help="once ready, complete TEXT through the endpoint (greedy) and print it (repeatable)")
    parser.add_argument("--complete-tokens", type=int, default=48, metavar="N", help="tokens per --complete")
    add_load_arguments(parser)


# launch flags that set a `serve` key: flag -> (attribute of args, key)
SERVE_FLAGS = {"--host": ("host", "host"), "--port": ("port", "port"),
               "--served-model-name": ("served_model_name", "model_name"),
               "--otlp-traces-endpoint": ("otlp_traces_endpoint", "otlp_traces_endpoint")}


def spec_to_launch(args: argparse.Namespace) -> Spec:
    """The spec ``args`` name or describe with every override of the command applied, so ``--print-spec`` prints
    what `launch_spec` starts: ``--backend``/``--address`` (launch), ``--host``, ``--port``,
    ``--served-model-name``, ``--otlp-traces-endpoint``, ``--access-log`` (serve) and ``--tiny`` (the tiny
    model on the CPU). Each flag is checked as its key is (a port in 0..65535, an http(s) URL).

    Raises:
        DisaggError: a bad spec or flag (the message names it).
    """
    import attrs

    from disaggsdk.errors import SpecError
    from disaggsdk.spec.field_checks import FieldErrors

    spec = with_runtime_options(spec_of_args(args), args)
    given = {flag: (key, getattr(args, attr)) for flag, (attr, key) in SERVE_FLAGS.items()
             if getattr(args, attr, None) not in (None, "")}  # bench shares launch_spec and has none of them
    overrides = {key: value for key, value in given.values()}
    if getattr(args, "access_log", False):
        overrides["access_log"] = True
    try:
        spec = attrs.evolve(spec, serve=attrs.evolve(spec.serve, **overrides))
    except FieldErrors as exc:
        flags = {key: flag for flag, (key, _value) in given.items()}
        raise SpecError([f"{flags.get(key, key)}: {message}" for key, message in exc.problems]) from None
    if getattr(args, "tiny", False):
        from disaggsdk.launch.tiny import tiny_spec

        spec = tiny_spec(spec)
    return spec


def launch_spec(args: argparse.Namespace, console: Console, colocated: bool, port: int | None = None,
                pin: bool = False) -> Deployment:
    """Load ``args.target``, start it and say when it is ready.

    Args:
        colocated: launch the colocated twin of the spec.
        port: overrides ``--port`` and the spec.
        pin: pin each instance to its own CPU core (the comparison runs of ``bench --compare``).
    Raises:
        DisaggError: a bad spec, missing hardware, or a runtime that failed to start.
    """
    from disaggsdk.face.deployment import launch
    from disaggsdk.launch.base import LaunchError

    spec = spec_to_launch(args)
    layout = "colocated" if colocated else "disaggregated"
    console.print(f"starting {spec.label} ({layout}{', tiny model' if args.tiny else ''}) ...", markup=False)
    start = time.monotonic()
    options = {"cpu_affinity": "auto"} if pin else {}  # unit i on core i mod cores
    if getattr(args, "log_dir", None):
        options["log_dir"] = args.log_dir
    if getattr(args, "max_restarts", None) is not None:
        if args.max_restarts < 0:
            raise LaunchError(f"--max-restarts {args.max_restarts}: give 0 or more")
        options["max_restarts"] = args.max_restarts
    if getattr(args, "restart_window_s", None) is not None:
        if not args.restart_window_s > 0:
            raise LaunchError(f"--restart-window-s {args.restart_window_s}: give a positive number of seconds")
        options["restart_window_s"] = args.restart_window_s
    def progress(line: str) -> None:  # each unit's loading / compiling / ready, where the ready line goes
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    # host, port and model name are in the spec (spec_to_launch); ``port`` (bench's 0) overrides it
    d = launch(spec, tiny=args.tiny, colocated=colocated, on_progress=progress, port=port, api_key=args.api_key,
               allowed_origins=getattr(args, "allowed_origins", ()), **options)
    instances = ", ".join(f"{s.name} ({s.role})" for s in d.backend.stats())
    console.print(f"[green]ready[/] in {time.monotonic() - start:.1f} s: {d.url}/v1  model {escape(d.model_name)}  "
                  f"instances: {instances}", soft_wrap=True)
    return d


def _wait_while_serving(d: Deployment) -> None:
    """Return never; raise LaunchError once the backend can serve no request again."""
    from disaggsdk.launch.base import LaunchError

    units = d.backend.units()
    while True:
        time.sleep(POLL_S)
        reason = units.unrecoverable() if units is not None else None
        if reason:
            raise LaunchError(f"shutting down: {reason}")


def serve_until_signal(d: Deployment, console: Console, live: bool) -> None:
    """Serve until SIGINT or SIGTERM (with the live instance table unless ``live`` is False), then shut down.

    SIGTERM arrives as SystemExit(143) (`launch.signals.sigterm_unwinds`, around every command in
    `cli.main`): the deployment shuts down the same way and the process exits 143, as a
    terminated process should; Ctrl-C returns normally.
    """
    from disaggsdk.report.live_table import LiveView, instance_table

    console.print("serving; Ctrl-C to stop")
    try:
        if live:
            render = lambda: instance_table(d.metrics().rows, title=d.url)  # noqa: E731
            with LiveView(render, console):
                _wait_while_serving(d)
        else:
            _wait_while_serving(d)
    except KeyboardInterrupt:
        pass
    finally:
        console.print("shutting down ...")
        d.shutdown()
        console.print("stopped")


def print_completions(d: Deployment, console: Console, prompts: list[str], max_tokens: int) -> None:
    """Complete each prompt through the deployment's OpenAI endpoint (greedy) and print prompt + completion."""
    from rich.panel import Panel
    from rich.syntax import Syntax

    for prompt in prompts:
        text = prompt + d.generate(prompt, max_tokens=max_tokens)
        console.print(Panel(Syntax(text, "python", theme="ansi_dark"), title=f"completion of {prompt!r}", expand=False))



def wait_for_compiled_steps(d: Deployment, console: Console) -> None:
    """Before a benchmark: wait until the units compiled their step (they serve on the eager step
    while they compile in the background, engine.background_compile; a benchmark measures the
    compiled one), saying so when they still compile."""
    if any(stage == "compiling" for stage in d.compile_stages().values()):
        console.print("waiting for the units to compile their step before the benchmark", highlight=False)
    d.wait_until_compiled()


def run(args: argparse.Namespace) -> int:
    """Launch, then serve until a signal, or benchmark and stop with ``--bench``.

    Returns:
        0 on a clean shutdown.
    """
    if args.print_spec:
        from disaggsdk.spec import spec_to_yaml

        print(spec_to_yaml(spec_to_launch(args)), end="")
        return 0
    if args.bench:
        bench_args.load_shape(args)  # a rate that cannot run (a sweep is bench's) fails before the start-up
        bench_args.check_result_filename(args)
    console = make_console(stderr=args.json)
    with launch_spec(args, console, colocated=args.colocated) as d:
        if args.complete:
            print_completions(d, console, args.complete, args.complete_tokens)
        if args.bench:
            wait_for_compiled_steps(d, console)
            result = run_load(args, console, d.url, d.model_name, d.api_key, d, title=d.name)
            report(args, console, [(d.name, result)])
            return 0
        serve_until_signal(d, console, live=not args.no_live)
    return 0
