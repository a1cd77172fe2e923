"""`disaggsdk serve --model M`: one colocated engine in this process behind the OpenAI-compatible server."""

from __future__ import annotations

import argparse
import time
from typing import get_args

from disaggsdk.cli.options import add_api_key_option
from disaggsdk.report.console import make_console
from disaggsdk.spec.engine_settings import BARE_NUM_PAGES, WeightDtype
from disaggsdk.spec.types import Spec

HELP = "Serve one colocated engine (tiny catalog model or checkpoint) over the OpenAI-compatible API."


_DEFAULT = Spec()  # the spec's defaults: a flag's default is the key's, declared once there

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the options of `serve`."""
    parser.add_argument("--model", required=True, help="tiny catalog name or Hugging Face checkpoint directory")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind")
    parser.add_argument("--port", type=int, default=8000, help="port; 0 picks a free one")
    add_api_key_option(parser, "require this bearer token")
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the model name clients send and /v1/models lists (default: --model)")
    parser.add_argument("--allowed-origins", nargs="*", default=[], metavar="ORIGIN",
                        help="web origins whose pages may call the server (CORS); '*' for any")
    parser.add_argument("--num-pages", type=int, default=BARE_NUM_PAGES, help="KV pages")
    parser.add_argument("--page-size", type=int, default=_DEFAULT.kv.page_size, help="tokens per KV page")
    parser.add_argument("--max-num-batched-tokens", type=int, default=_DEFAULT.engine.max_num_batched_tokens,
                        help="token budget per step")
    parser.add_argument("--max-num-seqs", type=int, default=_DEFAULT.engine.max_num_seqs, help="requests holding pages at once")
    parser.add_argument("--max-model-len", type=int, default=_DEFAULT.engine.max_model_len, metavar="TOKENS",
                        help="longest request, prompt + output (default: the model's context)")
    parser.add_argument("--device", default="cpu", help="torch device of the weights and KV pages")
    parser.add_argument("--dtype", default=_DEFAULT.engine.dtype, choices=get_args(WeightDtype), help="weight dtype")
    parser.add_argument("--no-live", action="store_true", help="no live instance table")
    parser.add_argument("--access-log", action="store_true",
                        help="one line per finished request on stdout: status, tokens, TTFT, total time, the instance")


def run(args: argparse.Namespace) -> int:
    """Build the engine, serve until SIGINT/SIGTERM, shut down.

    Returns:
        0 on a clean shutdown.
    """
    from disaggsdk.cli.launch_cmd import serve_until_signal
    from disaggsdk.engine.config import EngineConfig
    from disaggsdk.face.deployment import serve_model
    from disaggsdk.launch.progress import compile_progress_line, loading_line

    console = make_console()
    config = EngineConfig(
        num_pages=args.num_pages, page_size=args.page_size, max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
    )
    start = time.monotonic()
    say = lambda line: console.print(line, markup=False, highlight=False, soft_wrap=True)  # noqa: E731
    say(loading_line("mixed-0", args.model))  # the in-process engine's name (`InProcessBackend`)
    d = serve_model(args.model, config, args.host, args.port, args.api_key, served_model_name=args.served_model_name,
                    allowed_origins=args.allowed_origins, access_log=args.access_log,
                    on_compile=lambda progress: say(compile_progress_line("mixed-0", progress)))
    console.print(f"[green]ready[/] in {time.monotonic() - start:.1f} s: {d.url}/v1  model {d.model_name}")
    serve_until_signal(d, console, live=not args.no_live)
    return 0
