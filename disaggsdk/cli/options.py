"""What every `disaggsdk` command shares: help layout, hidden aliases, exit codes, --version, --log-level,
--api-key.

One name per concept across commands (``--output``, ``--num-prompts``, ``--input-len``,
``--output-len``, ``--model``, ``--request-rate``); an older spelling stays as a hidden alias
(`add_hidden_alias`) so scripts written against it keep working without cluttering ``--help``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from disaggsdk.launch.signals import SIGTERM_EXIT_CODE

PACKAGE = "disaggsdk"
API_KEY_ENV = "DISAGGSDK_API_KEY"  # where --api-key defaults from
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
DEFAULT_LOG_LEVEL = "warning"

# exit codes: what cli.main and the commands return
EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention
EXIT_TERMINATED = SIGTERM_EXIT_CODE  # 128 + SIGTERM

EXIT_CODES_EPILOG = f"""exit codes:
  {EXIT_OK}    success
  {EXIT_CHECK_FAILED}    the command ran but its check failed (simulate --validate outside tolerance,
       simulate --published: a figure off its published one, tune: no layout meets the SLOs,
       drain: requests still on the unit, move: it did not move, rebalance: a unit could not change role)
  {EXIT_USER_ERROR}    bad input: arguments, a path that cannot be read or written, a spec that does
       not validate, an unreachable server, a deployment that cannot start (one message, no
       traceback)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)
  {EXIT_TERMINATED}  terminated (SIGTERM); processes and shared memory are cleaned up first"""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, keeps the epilog's line breaks.

    No default is shown where it says nothing (None, False, an empty list) or where the help text
    already describes it ("default: the spec's port"); the latter also keeps secrets such as an
    API key read from the environment out of ``--help``.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if _says_nothing(action.default) or "default" in text.lower():
            return text
        return super()._get_help_string(action)


def _says_nothing(default: Any) -> bool:
    # identity, not equality: 0 and 0.0 are real defaults though they equal False
    return default is None or default is False or default is argparse.SUPPRESS or default in ("", [])


def add_hidden_alias(parser: Any, *flags: str, dest: str, **kwargs: Any) -> argparse.Action:
    """Accept ``flags`` as another spelling of the option stored in ``dest``, absent from ``--help``.

    Args:
        parser: a parser or argument group.
        flags: the old spellings, e.g. ``"--qps"``.
        dest: the primary option's destination.
        kwargs: what the primary option takes (``type``, ``action``...), so the values agree.
    Returns:
        the alias's action.
    """
    # SUPPRESS as default: the alias never overwrites the primary's default when it is not given
    return parser.add_argument(*flags, dest=dest, help=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)


def package_version() -> str:
    """The installed package's version (``importlib.metadata``), or "unknown" from a bare checkout."""
    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return "unknown"


def add_global_options(parser: argparse.ArgumentParser, top_level: bool) -> None:
    """``--log-level`` on the top parser and on every command (so it may follow the command name);
    ``--version`` on the top parser only.

    Args:
        parser: the top parser or a command's parser.
        top_level: whether ``parser`` is the top parser, which owns the default.
    """
    if top_level:
        parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    # a command's copy defaults to SUPPRESS: argparse lets a sub-parser's default overwrite the
    # value given before the command name otherwise
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS,
                        default=DEFAULT_LOG_LEVEL if top_level else argparse.SUPPRESS,
                        help=f"level of the {PACKAGE} logger (messages go to stderr)"
                             + ("" if top_level else f" (default: {DEFAULT_LOG_LEVEL})"))


def add_api_key_option(parser: argparse.ArgumentParser, help: str = "bearer token") -> None:
    """``--api-key``, whose default is the environment's ``DISAGGSDK_API_KEY``; ``help`` says what the
    command does with it (a client sends it, a server requires it)."""
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV), help=f"{help} (default: env {API_KEY_ENV})")


def set_log_level(level: str) -> logging.Logger:
    """Set the ``disaggsdk`` logger to ``level`` and give it a stderr handler if it has none.

    Returns:
        the logger.
    """
    logger = logging.getLogger(PACKAGE)
    logger.setLevel(level.upper())
    if not logger.handlers:  # Python's last-resort handler would drop everything below WARNING
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    return logger
