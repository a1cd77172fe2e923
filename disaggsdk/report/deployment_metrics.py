"""What `Deployment.metrics()` returns: the live instance rows, as a table wherever it is shown.

A table in Jupyter (`_repr_html_`), in a terminal (`__rich__`, `print`), and a pandas DataFrame
for code (`frame`); `rows` is the typed data underneath. Numbers come from
`disaggsdk.report.live`; this file only renders them.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol

from rich.table import Table

from disaggsdk.report.console import plain_text
from disaggsdk.report.dashboard import rows_html
from disaggsdk.report.live import InstanceRow
from disaggsdk.report.live_table import instance_table

if TYPE_CHECKING:
    import pandas


class _Printer(Protocol):
    """The part of IPython's pretty printer `_repr_pretty_` uses."""

    def text(self, obj: str) -> None: ...

PANDAS_MISSING = "DeploymentMetrics.frame() needs pandas: pip install 'disaggsdk[notebook]'"


@dataclass(frozen=True)
class DeploymentMetrics:
    """A snapshot of a deployment's live numbers, one row per instance.

    Attributes:
        num_served: requests the deployment has finished since it started.
        rows: one `InstanceRow` per instance (TTFT p50/p99 over the window, tokens/s per request,
            queues, KV usage, transfer GB/s); a latency is None where the instance served nothing
            in the window, and shows as ``-``.
        title: the deployment's name, shown above the table.
        notes: lines shown under the heading (the autoscale policy's latest decisions).
    """

    num_served: int
    rows: tuple[InstanceRow, ...]
    title: str = "instances"
    notes: tuple[str, ...] = ()

    def row(self, name: str) -> InstanceRow:
        """The row of instance ``name`` (``"decode-0"``).

        Raises:
            KeyError: no instance has that name (the message lists the names).
        """
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no instance {name!r}; the instances are {', '.join(r.name for r in self.rows)}")

    def frame(self) -> pandas.DataFrame:
        """The rows as a pandas DataFrame indexed by instance name, one column per `InstanceRow` field
        (a missing number is NaN in a column that has numbers, None in one that has none).

        Raises:
            ModuleNotFoundError: pandas is not installed (it comes with ``disaggsdk[notebook]``).
        """
        try:
            import pandas
        except ModuleNotFoundError:
            raise ModuleNotFoundError(PANDAS_MISSING, name="pandas") from None
        columns = [name for name in InstanceRow.__dataclass_fields__]
        return pandas.DataFrame([asdict(r) for r in self.rows], columns=columns).set_index("name")

    def _heading(self) -> str:
        return "\n".join([f"{self.title}: {self.num_served} requests served", *self.notes])

    def __rich__(self) -> Table:
        return instance_table(self.rows, title=self._heading())

    def _repr_html_(self) -> str:
        notes = "".join(f"<br>{html.escape(n)}" for n in self.notes)
        return f"<b>{html.escape(self._heading().splitlines()[0])}</b>{notes}{rows_html(self.rows)}"

    def __str__(self) -> str:
        return plain_text(self)  # the whole table, not one cut to 80 columns

    def __repr__(self) -> str:
        return f"<DeploymentMetrics {self.title}: {len(self.rows)} instances, {self.num_served} served>"

    def _repr_pretty_(self, printer: _Printer, cycle: bool) -> None:
        printer.text(str(self))  # IPython's text view (a terminal console, text/plain) shows the table

