"""Paths given on the command line: each declared with its kind (`PathOption`) and checked by `cli.main` before its
command does any work, so a file that cannot be read or written is one line and exit 2 (`PathOptionError`), not a
traceback, and never after minutes of benchmarking. `writing` turns an error of the write itself (a disk that
filled meanwhile) into the same line.

Arguments that name a file or something else (a SPEC or a URL, a profile name or its path, a catalog model or a
checkpoint directory) are checked where they are read (`spec.load_spec`, `sim.hardware.load_profile`,
`models.resolve_model`), with the same one-line errors.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from disaggsdk.errors import DisaggError, printable

PathKind = Literal["input file", "output file", "output dir"]


class PathOptionError(DisaggError):
    """A path given on the command line cannot be read or written; the message names the option and the path."""


class PathOption(argparse.Action):
    """``parser.add_argument("--output", action=PathOption, kind="output file", ...)``: stores the path as given
    and declares what the command does with it, for `check_path_options`."""

    def __init__(self, option_strings: Sequence[str], dest: str, kind: PathKind = "input file",
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.kind: PathKind = kind

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


def path_options(parser: argparse.ArgumentParser) -> tuple[PathOption, ...]:
    """The `PathOption` arguments of one command's parser."""
    return tuple(action for action in parser._actions if isinstance(action, PathOption))


def check_path_options(options: Sequence[PathOption], args: argparse.Namespace) -> None:
    """Check every path ``args`` holds for ``options``: an input file exists and can be read; an output file's
    folder exists or is made, and the file can be opened for writing (it is not left behind when it did not
    exist); an output folder exists or is made, and a file can be made in it.

    Raises:
        PathOptionError: the first path that cannot be used, with the option, the path and why.
    """
    for option in options:
        value = getattr(args, option.dest, None)
        for path in value if isinstance(value, list) else [value]:
            if path is None:
                continue
            name = option.option_strings[0] if option.option_strings else option.metavar or option.dest
            check_path(str(name), str(path), option.kind)


def check_path(option: str, path: str, kind: PathKind) -> Path:
    """Check one ``path`` given as ``option`` (see `check_path_options`).

    Returns:
        the path.
    Raises:
        PathOptionError: it cannot be used as ``kind``.
    """
    if not path:
        raise PathOptionError(f"{option}: the path is empty; give a {'folder' if kind == 'output dir' else 'file'}")
    where = Path(path)
    if kind == "input file":
        with writing(option, path, "cannot read it"):
            if stat.S_ISDIR(os.stat(path).st_mode):
                raise PathOptionError(f"{option} {printable(path)}: is a folder; give a file")
            if not os.access(path, os.R_OK):
                raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)
    elif kind == "output dir":
        with writing(option, path, "cannot make the folder"):
            if where.exists() and not where.is_dir():
                raise PathOptionError(f"{option} {printable(path)}: is a file; give a folder")
            where.mkdir(parents=True, exist_ok=True)
        with writing(option, path, "cannot write in the folder"):
            tempfile.TemporaryFile(dir=where).close()
    else:
        with writing(option, path, "cannot write it"):
            if where.is_dir():
                raise PathOptionError(f"{option} {printable(path)}: is a folder; give a file name")
            where.parent.mkdir(parents=True, exist_ok=True)
            existed = where.exists()
            with where.open("a"):
                pass
            if not existed:
                where.unlink()
    return where


@contextmanager
def writing(option: str, path: str | Path, failing: str = "cannot write it") -> Iterator[None]:
    """Around a read or write of ``path`` (given as ``option``): an OSError becomes a `PathOptionError` naming
    both, in one line: "--output /proc/x/r.json: cannot write it (no such file or directory)".

    Args:
        failing: what went wrong, for the message.
    Raises:
        PathOptionError: the read or write failed.
    """
    try:
        yield
    except OSError as exc:
        why = (exc.strerror or str(exc)).lower()
        raise PathOptionError(f"{option} {printable(str(path))}: {failing} ({why})") from None
    except ValueError:  # an embedded NUL byte (only from Python: argv cannot hold one)
        raise PathOptionError(f"{option} {printable(str(path))}: not a valid path") from None
