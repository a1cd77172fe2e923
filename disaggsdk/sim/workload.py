"""Simulated traffic: arrival times and prompt/output lengths, from a distribution or a trace (open loop), or
clients that each send their next request when their previous one finished (closed loop)."""

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
    client_id: int | None = None  # the closed-loop client that sent it (`ClosedLoop`); None: open-loop arrivals


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
            out.append(SimRequest(i, t, _length(rng, self.input_len, self.range_ratio, 2),
                                  _length(rng, self.output_len, self.range_ratio, 1)))
            i += 1


def _length(rng: random.Random, mean: int, range_ratio: float, minimum: int) -> int:
    """A length uniform in ``[mean * (1 - range_ratio), mean * (1 + range_ratio)]``, at least ``minimum``."""
    lo, hi = int(mean * (1 - range_ratio)), int(mean * (1 + range_ratio))
    return max(minimum, rng.randint(lo, hi) if hi > lo else mean)


@attrs.frozen
class ClosedLoop:
    """``concurrency`` clients, each sending its next request the moment its previous one finished (its last token
    reached the client), until ``num_requests`` have been sent: AIPerf's ``--concurrency`` with ``--request-count``,
    or ``disaggsdk bench --max-concurrency`` with every request due at once. All clients send their first request at
    time 0 to an idle deployment (AIPerf starts its profiling phase once its warm-up requests have all finished).

    Lengths are drawn as `Workload`'s are; the simulator (`simulator.Simulation.run`) sets each request's
    ``arrival_s`` when its client sends it.
    """

    concurrency: int
    num_requests: int
    input_len: int = 2048
    output_len: int = 256
    range_ratio: float = 0.0
    seed: int = 0

    def requests(self) -> list[SimRequest]:
        """The requests in the order they are sent, each with its client (request ``i`` of the first
        ``concurrency`` is client ``i``'s first; the rest go to whichever client is free first, so their
        ``client_id`` is None here and set when sent) and ``arrival_s`` 0.

        Raises:
            WorkloadError: concurrency or request count below 1, or lengths below what a request needs.
        """
        if self.concurrency < 1 or self.num_requests < 1 or self.input_len < 2 or self.output_len < 1:
            raise WorkloadError(f"a closed loop needs concurrency >= 1, num_requests >= 1, input_len >= 2 and "
                                f"output_len >= 1; got {self}")
        rng = random.Random(self.seed)
        return [SimRequest(i, 0.0, _length(rng, self.input_len, self.range_ratio, 2),
                           _length(rng, self.output_len, self.range_ratio, 1), i if i < self.concurrency else None)
                for i in range(self.num_requests)]


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
