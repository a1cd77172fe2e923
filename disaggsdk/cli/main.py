"""The `disaggsdk` command: a thin dispatcher over one module per sub-command.

Each command module defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Command modules import heavy parts (torch, the native library) inside ``run`` so that ``--help``
and spec commands stay fast. Every `DisaggError` becomes a message on stderr and exit code 2; the
exit codes are listed in every ``--help`` (`cli.options.EXIT_CODES_EPILOG`). Path options
(`cli.path_options.PathOption`) are checked before a command runs, so a path it cannot read or
write is one line too.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from rich.console import Console
from rich.markup import escape

from disaggsdk.cli.options import (
    EXIT_CODES_EPILOG,
    EXIT_INTERRUPTED,
    EXIT_USER_ERROR,
    HelpFormatter,
    add_global_options,
    package_version,
    set_log_level,
)
from disaggsdk.cli.path_options import check_path_options, path_options
from disaggsdk.cli.required_extras import command_extras, extra_for_missing_module, install_hint, missing_extras
from disaggsdk.errors import DisaggError

# sub-command -> module; the order is the order of `disaggsdk --help`.
COMMANDS = {
    "validate": "disaggsdk.cli.validate_cmd",
    "plan": "disaggsdk.cli.plan_cmd",
    "generate": "disaggsdk.cli.generate_cmd",
    "serve": "disaggsdk.cli.serve_cmd",
    "launch": "disaggsdk.cli.launch_cmd",
    "bench": "disaggsdk.cli.bench_cmd",
    "compare": "disaggsdk.cli.compare_cmd",
    "transfer-bench": "disaggsdk.cli.transfer_bench_cmd",
    "kv-bench": "disaggsdk.cli.kv_bench_cmd",
    "simulate": "disaggsdk.cli.simulate_cmd",
    "tune": "disaggsdk.cli.tune_cmd",
    "calibrate": "disaggsdk.cli.calibrate_cmd",
    "testbed": "disaggsdk.cli.testbed_cmd",
    "drain": "disaggsdk.cli.drain_cmd",
    "move": "disaggsdk.cli.move_cmd",
    "rebalance": "disaggsdk.cli.rebalance_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    parser = argparse.ArgumentParser(
        prog="disaggsdk",
        description="Plan, launch and measure disaggregated prefill/decode LLM serving.\n\n"
                    "--version -v (or --version --verbose) also prints torch's version, this CPU and the\n"
                    "kernels the engine will run on it.",
        epilog=EXIT_CODES_EPILOG, formatter_class=HelpFormatter,
    )
    add_global_options(parser, top_level=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=module.HELP, description=module.HELP, epilog=EXIT_CODES_EPILOG,
                             formatter_class=HelpFormatter)
        module.add_arguments(cmd)
        add_global_options(cmd, top_level=False)
        cmd.set_defaults(run=module.run, path_options=path_options(cmd))
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script. Returns the process exit code; as the process's own entry
    (``argv`` None), it leaves at once with that code where an engine is still compiling its step
    in the background (a short `generate`, a server stopped in its first minutes): waiting for the
    compiler, or ending Python under it, would cost minutes or abort (engine.background_compile)."""
    try:
        code = _main(argv)
    except SystemExit as exc:  # SIGTERM arrives as SystemExit(143) (launch.signals), argparse's errors too
        if argv is not None or not isinstance(exc.code, int):
            raise
        code = exc.code
    if argv is None and "disaggsdk.engine.background_compile" in sys.modules:
        from disaggsdk.engine.background_compile import running_compilations

        if running_compilations():
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code


def _main(argv: list[str] | None) -> int:
    from disaggsdk.cli.version_info import version_text, wants_verbose_version

    if wants_verbose_version(sys.argv[1:] if argv is None else argv):  # argparse's --version exits before -v
        print(version_text(package_version(), verbose=True))
        return 0
    args = build_parser().parse_args(argv)  # bad arguments: argparse prints usage and exits 2
    set_log_level(args.log_level)
    # a missing pip extra is one line before anything starts, not a traceback from deep inside
    extras = command_extras(args.command, args)
    missing = missing_extras(extras)
    if missing:
        print(f"error: {install_hint(args.command, missing)}", file=sys.stderr)
        return EXIT_USER_ERROR
    from disaggsdk.launch.signals import sigterm_unwinds

    try:
        # every command may own processes (bench SPEC, simulate --validate, calibrate --deployment):
        # SIGTERM unwinds like Ctrl-C, so their `with` blocks stop units and remove shared memory
        with sigterm_unwinds():
            check_path_options(args.path_options, args)  # one line, before the command does any work
            return int(args.run(args) or 0)
    except ModuleNotFoundError as exc:
        # an import the table above did not foresee (a lazy ray or cuda-python import): the same line
        extra = extra_for_missing_module(exc.name, extras)
        if extra is None:
            raise  # not a module any extra installs: a bug, its traceback is the report
        print(f"error: {install_hint(args.command, (extra,))}", file=sys.stderr)
        return EXIT_USER_ERROR
    except DisaggError as exc:
        err = Console(stderr=True, highlight=False)
        for line in str(exc).splitlines():  # the text is the user's (a path, a key): not rich markup
            err.print(f"[bold red]error:[/] {escape(line)}", markup=True, soft_wrap=True)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
