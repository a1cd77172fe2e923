"""The rich Console the command line prints its tables on, at the width the output is given.

rich measures a terminal; anything else (a pipe, a CI log, `make demo | tee`) it treats as 80
columns and cuts table cells to ``transfe…``. Here a terminal keeps its width, ``COLUMNS`` is
obeyed where set, and otherwise the console is wide enough that no table of ours is cut.
"""

from __future__ import annotations

import io
import os
import sys

from rich.console import Console, RenderableType

# a ceiling, not the width printed: tables take their natural width, and nothing the CLI prints
# expands to fill the line (panels are built with expand=False), so a piped table is as wide as
# its cells and text lines are not broken before this many columns
UNBOUNDED_COLUMNS = 400


def make_console(stderr: bool = False, highlight: bool = True) -> Console:
    """A rich Console for the CLI's output.

    Args:
        stderr: print on stderr (``--json`` keeps stdout for the JSON).
        highlight: colour numbers and strings rich recognises (off where the text is a spec or plan).

    Returns:
        a Console as wide as the terminal when there is one; else ``COLUMNS`` wide when that is
        set; else `UNBOUNDED_COLUMNS` wide, so that a table is never truncated.
    """
    console = Console(stderr=stderr, highlight=highlight)
    # the stream itself, not rich's is_terminal: FORCE_COLOR (set in many CI logs) makes rich
    # treat a pipe as a terminal, whose size it cannot read, and fall back to 80 columns
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return console  # rich reads the terminal's size, or COLUMNS, itself
    return Console(stderr=stderr, highlight=highlight, width=UNBOUNDED_COLUMNS)


def plain_text(renderable: RenderableType) -> str:
    """``renderable`` as plain text (no colour, trailing spaces trimmed), as wide as it needs up to
    `UNBOUNDED_COLUMNS`: for ``print`` and Jupyter's text/plain, which have no width to ask."""
    out = io.StringIO()
    # force_jupyter=False: in a kernel rich would display the text as a cell output, not write it to out
    Console(file=out, width=UNBOUNDED_COLUMNS, color_system=None, highlight=False, force_jupyter=False).print(renderable)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())
