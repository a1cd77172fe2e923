"""Search prefill:decode ratios and TP/DP shapes for the most goodput per GPU under SLOs.

A candidate is a *unit*: ``p`` prefill and ``d`` decode instances of given shapes (or one
colocated instance). For each unit the simulator finds, by bisection, the highest request rate
whose SLOs hold; goodput per GPU is that rate over the unit's GPUs. The best unit is scaled to
the target rate within the GPU budget and emitted as a spec.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.models import ModelArch
from disaggsdk.plan.memory import spec_memory_problems
from disaggsdk.sim.simulator import SimConfig, Simulation
from disaggsdk.sim.workload import Workload
from disaggsdk.spec import Role, Spec, spec_problems
from disaggsdk.spec.topology import MAX_INSTANCE_PAIRS, MAX_RANKS

SLO_KEY = re.compile(r"^(ttft|tpot|itl|e2el)_(p\d+(?:\.\d+)?|mean|median)_ms$")
RATIOS = ((1, 1), (1, 2), (1, 3), (1, 4), (2, 3), (2, 1))


def parse_slos(text: str) -> dict[str, float]:
    """``"ttft_p90_ms=500,itl_p99_ms=50"`` -> ``{"p90_ttft_ms": 500.0, "p99_itl_ms": 50.0}``.

    Raises:
        SpecError: a key not of the form METRIC_STAT_ms or a value that is not a positive number.
    """
    slos = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        m = SLO_KEY.match(key.strip())
        if not m:
            raise SpecError(f"--slo: {key!r} is not METRIC_STAT_ms with METRIC in ttft, tpot, itl, e2el "
                            f"and STAT pNN, mean or median (e.g. ttft_p90_ms=500)")
        try:
            limit = float(value)
        except ValueError:
            limit = -1.0
        if limit <= 0:
            raise SpecError(f"--slo: {key} needs a positive number of milliseconds, got {value!r}")
        slos[f"{m.group(2)}_{m.group(1)}_ms"] = limit
    if not slos:
        raise SpecError("--slo: give at least one SLO, e.g. ttft_p90_ms=500,itl_p99_ms=50")
    return slos


@attrs.frozen
class Candidate:
    """A deployable unit: ``prefills`` x prefill role + ``decodes`` x decode role, or colocated."""

    prefill: Role
    decode: Role
    colocated: bool

    @property
    def gpus(self) -> int:
        return self.prefill.replicas * self.prefill.ranks_per_instance + self.decode.replicas * self.decode.ranks_per_instance

    @property
    def label(self) -> str:
        def shape(r: Role) -> str:
            return f"tp{r.tp}" + (f"xdp{r.dp}" if r.dp > 1 else "")
        if self.colocated:
            return f"colocated {self.prefill.replicas + self.decode.replicas}x{shape(self.decode)}"
        return f"{self.prefill.replicas}P({shape(self.prefill)}):{self.decode.replicas}D({shape(self.decode)})"


def candidate_units(base: Spec, arch: ModelArch) -> list[Candidate]:
    """Units valid for the model on the base spec's nodes, whose every rank fits its memory (`plan.memory`).

    Data-parallel shapes of an MoE model partition its experts over the instance (``ep = tp * dp``): a whole
    copy of R1 per dp rank fits no GPU.
    """
    g = base.hardware.gpus_per_node
    shapes = [Role(tp=g), Role(tp=g // 2)] if g >= 2 else [Role(tp=g)]
    if arch.attention == "mla" and g > 1:
        shapes.append(Role(tp=1, dp=g, ep=g if arch.is_moe else 1))

    def valid(role: Role) -> bool:
        spec = attrs.evolve(base, prefill=role, decode=role)
        return not spec_problems(spec, arch) and not spec_memory_problems(spec, arch)
    shapes = [s for s in shapes if valid(s)]
    # colocated: the same shape twice (a spec always has a prefill and a decode role; both mix)
    out = [Candidate(attrs.evolve(s, replicas=1), attrs.evolve(s, replicas=1), True) for s in shapes]
    for p_shape in [s for s in shapes if s.dp == 1]:
        for d_shape in shapes:
            for p, d in RATIOS:
                out.append(Candidate(attrs.evolve(p_shape, replicas=p), attrs.evolve(d_shape, replicas=d), False))
    return out


def _meets(summary: dict[str, Any], slos: dict[str, float]) -> bool:
    return summary["failed"] == 0 and all(summary[k] <= v for k, v in slos.items())


def highest_rate(ok: Callable[[float], bool], start_rate: float, max_rate: float, bisections: int) -> float:
    """The highest rate ``ok`` accepts: doubling from ``start_rate`` (halving, down to an eighth of it, if
    that fails) while at most ``max_rate``, then ``bisections`` geometric bisections of the bracket;
    0 when none is accepted."""
    low = start_rate
    while not ok(low):
        low /= 2
        if low < start_rate / 8:
            return 0.0
    high = low * 2
    while high <= max_rate and ok(high):
        low, high = high, high * 2
    if high > max_rate:
        return low
    for _ in range(bisections):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def highest_count(ok: Callable[[int], bool], start: int, maximum: int) -> int:
    """The highest count ``ok`` accepts, for an ``ok`` that holds up to some count and fails above it: doubling
    from ``start`` while at most ``maximum``, then bisecting the bracket to the exact count; 0 when ``start``
    fails (``maximum`` when every count tried holds).

    Raises:
        ValueError: ``start`` below 1 or above ``maximum``.
    """
    if not 1 <= start <= maximum:
        raise ValueError(f"highest_count needs 1 <= start <= maximum, got start {start}, maximum {maximum}")
    if not ok(start):
        return 0
    low, high = start, min(2 * start, maximum)
    while high > low and ok(high):
        low, high = high, min(2 * high, maximum)
    if high == low:  # every count up to the maximum held
        return low
    while high - low > 1:  # ok(low) holds, ok(high) fails
        mid = (low + high) // 2
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def max_rate(spec: Spec, config: SimConfig, colocated: bool, slos: dict[str, float], workload: Workload,
             start_qps: float = 0.5, max_qps: float = 64.0, bisections: int = 4) -> float:
    """Highest request rate whose SLOs hold (0 if even ``start_qps / 8`` fails).

    Doubles from ``start_qps`` until a rate fails, then bisects (geometrically) that bracket
    ``bisections`` times, so the answer is within a factor 2 ** (1 / 2 ** bisections).
    """
    percentiles = tuple(sorted({float(k.split("_")[0][1:]) for k in slos if k.startswith("p")} | {50.0, 99.0}))
    config = attrs.evolve(config, colocated=colocated, percentiles=percentiles)

    def ok(rate: float) -> bool:
        reqs = attrs.evolve(workload, qps=rate).requests()
        return bool(reqs) and _meets(Simulation(spec, config).run(reqs), slos)

    return highest_rate(ok, start_qps, max_qps, bisections)


def _plannable(cand: Candidate, units: int) -> bool:
    """Whether ``units`` copies of ``cand`` stay within the spec's size bounds (ranks, instance pairs)."""
    p, d = cand.prefill, cand.decode
    ranks = units * (p.replicas * p.ranks_per_instance + d.replicas * d.ranks_per_instance)
    return ranks <= MAX_RANKS and units * p.replicas * units * d.replicas <= MAX_INSTANCE_PAIRS


def tune(base: Spec, arch: ModelArch, config: SimConfig, slos: dict[str, float], workload: Workload,
         gpus: int, target_qps: float, candidates: list[Candidate] | None = None) -> list[dict[str, Any]]:
    """Rank candidate units by goodput per GPU; each row says how many units the target needs.

    Args:
        candidates: units to try (default: every `candidate_units` of the model).
    Returns:
        rows sorted best first: label, unit GPUs, max qps, goodput per GPU, units needed, GPUs
        needed, whether it fits the budget, and the scaled spec. A row whose units make a deployment past the
        spec's size bounds (`spec.rules.size_problems`) does not fit and keeps the spec of one unit.
    """
    rows = []
    for cand in candidates if candidates is not None else candidate_units(base, arch):
        spec = attrs.evolve(base, prefill=cand.prefill, decode=cand.decode)
        rate = max_rate(spec, config, cand.colocated, slos, workload)
        units = math.ceil(target_qps / rate) if rate > 0 else 0
        plannable = _plannable(cand, max(units, 1))
        scaled = attrs.evolve(spec, prefill=attrs.evolve(cand.prefill, replicas=cand.prefill.replicas * max(units, 1)),
                              decode=attrs.evolve(cand.decode, replicas=cand.decode.replicas * max(units, 1))) \
            if plannable else spec
        rows.append({"label": cand.label, "colocated": cand.colocated, "unit_gpus": cand.gpus,
                     "max_qps": rate, "goodput_per_gpu": rate / cand.gpus, "units": units,
                     "gpus_needed": units * cand.gpus, "fits": plannable and 0 < units * cand.gpus <= gpus,
                     "spec": scaled})
    return sorted(rows, key=lambda r: (not r["fits"], -r["goodput_per_gpu"]))
