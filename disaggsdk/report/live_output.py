"""One output of a notebook cell that is redrawn in place: the live dashboard and launch's status line.

In a Jupyter kernel the output is a ``display_data`` with a display id, and each redraw an
``update_display_data`` for that id, which Jupyter (Lab, Notebook, VS Code) applies to the output
wherever it is, also from a background thread after the cell has finished. A saved notebook keeps
the last redraw the client received, and nbconvert's HTML export shows it as plain HTML: no widget,
no widget state, no script from a CDN.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel's (IPython over ZMQ), whose client can redraw an output."""
    zmqshell = sys.modules.get("ipykernel.zmqshell")  # loaded by every running ipykernel, never imported here
    if zmqshell is None:
        return False
    from IPython import get_ipython

    return isinstance(get_ipython(), zmqshell.ZMQInteractiveShell)


class LiveOutput:
    """A cell output that `show` puts in the notebook and `redraw` replaces, in every place it was shown.

    Attributes:
        display_id: the id its ``display_data`` and ``update_display_data`` messages carry.
        shown: whether `show` has put it in a kernel's output (only then does `redraw` send anything).
    """

    def __init__(self, name: str):
        self.display_id = f"disaggsdk-{name}-{uuid.uuid4().hex}"
        self.shown = False

    def show(self, bundle: Mapping[str, str]) -> None:
        """Put ``bundle`` (mime type -> content) in the current cell's output, as a display that
        `redraw` can replace. Showing it again (a later cell) adds one more place that redraws."""
        from IPython.display import display

        display(dict(bundle), raw=True, display_id=self.display_id)  # type: ignore[no-untyped-call]  # IPython: untyped
        self.shown = True

    def redraw(self, bundle: Mapping[str, str]) -> None:
        """Replace every place this output was shown with ``bundle``; nothing before `show`, or outside a kernel."""
        if not self.shown or not in_kernel():
            return
        from IPython.display import update_display

        update_display(dict(bundle), raw=True, display_id=self.display_id)  # type: ignore[no-untyped-call]  # IPython: untyped
