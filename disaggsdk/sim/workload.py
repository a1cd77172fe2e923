"""Simulated traffic: arrival times and prompt/output lengths, from a distribution or a trace."""

from __future__ import annotations

import json
import random
from pathlib import Path

import attrs

from disaggsdk.errors import DisaggError, printable


class WorkloadError(DisaggError):
    """A workload description or trace file cannot be used."""


@attrs.frozen
class SimRequest:
    """One request of a simulated workload."""

    request_id: int
    arrival_s: float
    input_len: int
    output_len: int


@attrs.frozen
class Workload:
    """Poisson (or gamma, for burstiness != 1) arrivals at ``qps`` for ``duration_s``.

    Lengths are uniform in ``[len * (1 - range_ratio), len * (1 + range_ratio)]`` as in vLLM's
    random dataset. ``burstiness`` < 1 is burstier than Poisson, > 1 more regular.
    """

    qps: float
    duration_s: float
    input_len: int = 2048
    output_len: int = 256
    range_ratio: float = 0.0
    burstiness: float = 1.0
    seed: int = 0

    def requests(self) -> list[SimRequest]:
        """The arrivals, in time order.

        Raises:
            WorkloadError: non-positive rate, duration or lengths.
        """
        if self.qps <= 0 or self.duration_s <= 0 or self.input_len < 2 or self.output_len < 1:
            raise WorkloadError(
                f"workload needs qps > 0, duration_s > 0, input_len >= 2, output_len >= 1; got {self}")
        rng = random.Random(self.seed)
        shape = self.burstiness
        scale = 1.0 / (self.qps * shape)
        out: list[SimRequest] = []
        t, i = 0.0, 0
        while True:
            t += rng.gammavariate(shape, scale)
            if t >= self.duration_s:
                return out
            out.append(SimRequest(i, t, self._length(rng, self.input_len, 2), self._length(rng, self.output_len, 1)))
            i += 1

    def _length(self, rng: random.Random, mean: int, minimum: int) -> int:
        lo, hi = int(mean * (1 - self.range_ratio)), int(mean * (1 + self.range_ratio))
        return max(minimum, rng.randint(lo, hi) if hi > lo else mean)


def load_trace(path: str | Path) -> list[SimRequest]:
    """Requests from a JSON-lines trace: one ``{"arrival_s", "input_len", "output_len"}`` per line.

    Raises:
        WorkloadError: missing file, bad JSON (with its line number) or a missing field.
    """
    path = Path(path)
    try:
        if not path.is_file():
            raise WorkloadError(f"trace file {printable(str(path))} not found")
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise WorkloadError(f"trace file {printable(str(path))}: cannot read it ({why})") from None
    out: list[SimRequest] = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append(SimRequest(len(out), float(row["arrival_s"]), int(row["input_len"]), int(row["output_len"])))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise WorkloadError(f"{path}:{n}: expected {{\"arrival_s\", \"input_len\", \"output_len\"}}: {exc}") from None
    return sorted(out, key=lambda r: r.arrival_s)
