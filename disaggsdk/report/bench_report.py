"""What `Deployment.bench` returns: vLLM ``bench serve``'s result dict, shown as the benchmark table.

The numbers are `disaggsdk.bench.serve_bench.bench`'s; this file only renders them, as the table
``disaggsdk bench`` prints (`live_table.summary_table`): by ``print`` and ``str``, in a terminal
(rich), in IPython's text view, and as HTML in Jupyter.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any, Protocol

from rich.table import Table

from disaggsdk.report.console import plain_text
from disaggsdk.report.live_table import summary_rows, summary_table


class _Printer(Protocol):
    """The part of IPython's pretty printer `_repr_pretty_` uses."""

    def text(self, obj: str) -> None: ...


# a dict, not a record of its own: scripts written for vLLM's result files read it by key, and
# json.dump writes it as it is
class BenchReport(dict[str, Any]):
    """The results of one benchmark run, with the field names of vLLM's ``bench serve``
    (``report["mean_ttft_ms"]``, ``json.dump(report, f)``), shown as a table wherever it is shown.

    Args:
        results: the run's results (`disaggsdk.bench.serve_bench.bench`).
        label: the run's column heading (the deployment's name).
    """

    label: str

    def __init__(self, results: Mapping[str, Any], label: str = "result"):
        super().__init__(results)
        self.label = label

    def _runs(self) -> list[tuple[str, Mapping[str, object]]]:
        return [(self.label, self)]

    def __rich__(self) -> Table:
        return summary_table(self._runs())

    def _repr_html_(self) -> str:
        head = f"<th>metric</th><th>{html.escape(self.label)}</th>"
        body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
                       for row in summary_rows(self._runs()))
        return (f'<table class="disaggsdk-bench"><caption style="text-align:left"><b>benchmark</b></caption>'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def __str__(self) -> str:
        return plain_text(self)  # the table `disaggsdk bench` prints, not the dict

    def _repr_pretty_(self, printer: _Printer, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text view (a terminal console, text/plain) shows the table
