"""Simulate the published cases (`disaggsdk.sim.published`) and judge each figure: `disaggsdk simulate --published`."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.sim.aiconfigurator_peer import Prediction, predict
from disaggsdk.sim.hardware import HardwareProfile, load_profile
from disaggsdk.sim.instance import RequestRecord, SimInstance
from disaggsdk.sim.kernels import KERNEL_KINDS
from disaggsdk.sim.published import (
    CASES,
    ConcurrencySweep,
    DecodeThroughput,
    GoodputGain,
    PhaseSteps,
    PrefillThroughput,
    PublishedCase,
    PublishedFigure,
    PublishedRow,
    ServingLoad,
    TokensPerRequest,
    TtftPenalty,
    case_names,
)
from disaggsdk.sim.runner import default_profile_name, run_simulations
from disaggsdk.sim.simulator import SimConfig, Simulation, default_weight_dtype, gpu_kernel_costs
from disaggsdk.sim.tune import highest_count
from disaggsdk.sim.workload import ClosedLoop, SimRequest
from disaggsdk.spec import Spec, load_spec

PROFILES_DIR = Path(__file__).parent / "profiles"
SEED = 0  # seeds the arrivals of every case


def published_specs_dir() -> Path:
    """``specs/published/`` of the repository this package is in.

    Raises:
        SpecError: it is not there (the specs ship with the repository, not in the wheel).
    """
    folder = Path(__file__).resolve().parents[2] / "specs" / "published"
    if not folder.is_dir():
        raise SpecError(f"{folder} not found: the published cases' specs ship with the disaggsdk repository "
                        f"(specs/published/), not in the installed package; run from a checkout")
    return folder


@attrs.frozen
class FigureResult:
    """One figure: published, simulated, judged, with the peer's prediction and the kernel sources."""

    case: PublishedCase
    figure: PublishedFigure
    simulated: float | None
    detail: str  # how the simulated number came about, in words
    sources: Mapping[str, str]  # kernel kind -> where its times came from
    aiconfigurator: Prediction | None  # None: not run (the command is not installed, or it cannot predict this)

    @property
    def error(self) -> float | None:
        return self.figure.error(self.simulated)

    @property
    def holds(self) -> bool:
        return self.figure.holds(self.simulated)

    def to_json(self) -> PublishedRow:
        """The figure as `simulate --published --json` prints it."""
        peer = self.aiconfigurator
        return {
            "name": self.case.name, "metric": self.figure.metric, "unit": self.figure.unit,
            "claim": self.figure.claim, "comparison": self.figure.comparison,
            "published": self.figure.value, "simulated": self.simulated, "error": self.error, "holds": self.holds,
            "aiconfigurator": peer.value if peer is not None else None,
            "aiconfigurator_note": peer.note if peer is not None else None,
            "sources": dict(self.sources), "detail": self.detail, "load": self.case.workload.load_model,
            "source": str(self.figure.citation),
            "spec": f"specs/published/{self.case.spec}",
        }


def select_cases(name: str | None) -> list[PublishedCase]:
    """Every case, or the one named.

    Raises:
        SpecError: no case has that name (the message lists them, and the closest).
    """
    if name is None:
        return list(CASES)
    for case in CASES:
        if case.name == name:
            return [case]
    close = difflib.get_close_matches(name, case_names(), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise SpecError(f"--published: no published case {name!r}; {hint}use one of {', '.join(case_names())}")


def run_published(name: str | None = None, aiconfigurator: str | None = None) -> list[FigureResult]:
    """Simulate every case (or the one named) and judge its figures.

    Args:
        aiconfigurator: the ``aiconfigurator`` executable to run as the peer (`aiconfigurator_peer.find_command`),
            or None to leave the peer's column empty.
    Raises:
        SpecError: an unknown name, or a published spec that does not load.
    """
    results = []
    for case in select_cases(name):
        results += run_case(case, aiconfigurator)
    return results


def run_case(case: PublishedCase, aiconfigurator: str | None = None) -> list[FigureResult]:
    """Simulate one case with its workload; one result per figure, in the case's order."""
    folder = published_specs_dir()
    spec = load_spec(folder / case.spec)
    profile, profile_file = shipped_profile(spec)
    if profile.kernel_db is not None:  # the sources this case's steps read, not an earlier case's
        gpu_kernel_costs(profile).forget_counts()
    if isinstance(case.workload, ServingLoad):
        simulated = _serve(case, case.workload, spec, profile)
    elif isinstance(case.workload, PhaseSteps):
        simulated = _step_phases(case, case.workload, spec, profile)
    else:
        assert case.baseline_spec is not None, f"{case.name}: a concurrency sweep compares the spec with a baseline"
        baseline = load_spec(folder / case.baseline_spec)
        simulated = _sweep_concurrency(case, case.workload, spec, baseline, profile)
    sources = kernel_sources(profile, profile_file)
    results = []
    for figure, (value, detail) in zip(case.figures, simulated):
        peer = predict(figure.aiconfigurator, aiconfigurator) \
            if aiconfigurator is not None and figure.aiconfigurator is not None else None
        results.append(FigureResult(case, figure, value, detail, sources, peer))
    return results


def shipped_profile(spec: Spec) -> tuple[HardwareProfile, str]:
    """The profile shipped for the spec's GPU kind and its file, as the repository names it."""
    name = default_profile_name(spec)
    return load_profile(PROFILES_DIR / f"{name}.yaml"), f"disaggsdk/sim/profiles/{name}.yaml"


def kernel_sources(profile: HardwareProfile, profile_file: str) -> dict[str, str]:
    """Kernel kind -> where the simulator's times for it came from: the profile's measured tables (with how many
    lookups each fit since the case began) or its roofline."""
    if profile.kernel_db is None:
        return {kind: f"roofline ({profile_file})" for kind in KERNEL_KINDS}
    return dict(gpu_kernel_costs(profile).sources())


def _config(spec: Spec, profile: HardwareProfile, tokens_per_rank: int | None = None) -> SimConfig:
    """The simulator's settings for a spec: weights in the checkpoint's format, and the step budget of
    ``tokens_per_rank`` (default: the spec's `$.engine.max_num_batched_tokens`) on each prefill attention rank (the
    simulator's budget is an instance's)."""
    per_rank = tokens_per_rank if tokens_per_rank is not None else spec.engine.max_num_batched_tokens
    return SimConfig(profile, weight_dtype=default_weight_dtype(spec.model),
                     max_num_batched_tokens=per_rank * spec.prefill.dp)


Simulated = list[tuple[float | None, str]]  # one (value, detail) per figure of a case


# serving under Poisson arrivals

def _serve(case: PublishedCase, load: ServingLoad, spec: Spec, profile: HardwareProfile) -> Simulated:
    needs_colocated = any(isinstance(f.measure, TtftPenalty) or f.measure == TokensPerRequest("colocated")
                          for f in case.figures)
    result = run_simulations(spec, _config(spec, profile), [False, True] if needs_colocated else [False],
                             rates=[load.request_rate], duration_s=load.duration_s, input_len=load.input_len,
                             output_len=load.output_len, seed=SEED)
    runs = {run["mode"]: run for run in result["runs"]}
    load_words = f"{load.request_rate:g} QPS of {load.input_len:,} -> {load.output_len} tokens for {load.duration_s:g} s"
    out: Simulated = []
    for figure in case.figures:
        if isinstance(figure.measure, TokensPerRequest):
            run = runs[figure.measure.layout]
            out.append((run["mean_tokens_per_s_per_request"],
                        f"{figure.measure.layout}, {load_words}: mean TPOT {run['mean_tpot_ms']:.1f} ms"))
        elif isinstance(figure.measure, TtftPenalty):
            dis, col = runs["disaggregated"]["mean_ttft_ms"], runs["colocated"]["mean_ttft_ms"]
            out.append((dis - col, f"{load_words}: mean TTFT {dis:.0f} ms disaggregated, {col:.0f} ms colocated"))
        else:
            raise AssertionError(f"{case.name}: {figure.measure} is not measured under a serving load")
    return out


# each phase alone at the source's batch

def _step_phases(case: PublishedCase, steps: PhaseSteps, spec: Spec, profile: HardwareProfile) -> Simulated:
    gpus_per_node = spec.hardware.gpus_per_node
    out: Simulated = []
    for figure in case.figures:
        if isinstance(figure.measure, PrefillThroughput):
            sim = Simulation(spec, _config(spec, profile, tokens_per_rank=steps.prefill_tokens_per_rank))
            prompts = steps.prefill_tokens_per_rank // steps.input_len * spec.prefill.dp
            tokens, dt = _one_step(sim.prefill[0], prompts, steps.input_len, 1)
            nodes = spec.prefill.ranks_per_instance / gpus_per_node
            out.append((tokens / dt / nodes,
                        f"one prefill step of {prompts} prompts of {steps.input_len:,} "
                        f"({steps.prefill_tokens_per_rank // steps.input_len} a rank, {tokens:,} tokens computed) "
                        f"on {nodes:g} nodes: {dt * 1e3:.0f} ms"))
        elif isinstance(figure.measure, DecodeThroughput):
            sim = Simulation(spec, _config(spec, profile))
            wanted = steps.decode_seqs_per_rank * spec.decode.dp
            batch, dt = _one_step(sim.decode[0], wanted, steps.decode_context_len, steps.output_len)
            nodes = spec.decode.ranks_per_instance / gpus_per_node
            held = "" if batch == wanted else \
                f" (the {wanted:,} asked for do not fit its KV pool with {steps.output_len} tokens to go each)"
            out.append((batch / dt / nodes,
                        f"one decode step of {batch:,} sequences{held}, {batch / spec.decode.dp:.0f} a rank, with "
                        f"{steps.decode_context_len:,} tokens of KV each, on {nodes:g} nodes: {dt * 1e3:.1f} ms"))
        else:
            raise AssertionError(f"{case.name}: {figure.measure} is not measured in a phase step")
    return out


def _one_step(instance: SimInstance, count: int, input_len: int, output_len: int) -> tuple[int, float]:
    """Admit ``count`` requests to a prefill or decode instance and run its first step: (tokens the step computed
    or emitted, its seconds). A prefill step's tokens are its chunks'; a decode step's are the sequences it took
    (as many as its KV pool holds)."""
    for i in range(count):
        record = RequestRecord(SimRequest(i, 0.0, input_len, output_len))
        if instance.mode == "prefill":
            instance.admit_prefill(record)
        else:
            instance.admit_decode(record)
    dt, chunks = instance.plan_step(0.0)
    if chunks:
        return sum(n for _, n in chunks), dt
    return instance.finish_step(chunks, dt, dt).num_tokens, dt


# the best fixed concurrency meeting an SLA, against a baseline

def _sweep_concurrency(case: PublishedCase, sweep: ConcurrencySweep, spec: Spec, baseline: Spec,
                       profile: HardwareProfile) -> Simulated:
    layouts = {"disaggregated": (spec, False), "aggregated": (baseline, True)}
    cache: dict[tuple[str, int], dict[str, Any]] = {}

    def summary(layout: str, concurrency: int) -> dict[str, Any]:
        if (layout, concurrency) not in cache:
            layout_spec, colocated = layouts[layout]
            config = attrs.evolve(_config(layout_spec, profile), colocated=colocated)
            load = ClosedLoop(concurrency, sweep.requests_per_client * concurrency, sweep.input_len, sweep.output_len,
                              seed=SEED)
            cache[layout, concurrency] = Simulation(layout_spec, config).run(load)
        return cache[layout, concurrency]

    out: Simulated = []
    for figure in case.figures:
        if not isinstance(figure.measure, GoodputGain):
            raise AssertionError(f"{case.name}: {figure.measure} is not measured by a concurrency sweep")
        sla = figure.measure
        per_gpu, words = {}, []
        for layout, (layout_spec, _) in layouts.items():
            gpus = layout_spec.prefill.replicas * layout_spec.prefill.ranks_per_instance \
                + layout_spec.decode.replicas * layout_spec.decode.ranks_per_instance
            highest_count(functools.partial(_meets_sla, summary, layout, sla), sweep.start_concurrency,
                          sweep.max_concurrency)
            meeting = [n for (name, n) in cache if name == layout and _meets_sla(summary, layout, sla, n)]
            if not meeting:
                per_gpu[layout] = 0.0
                words.append(f"{layout}: not even {sweep.start_concurrency} client meets it")
                continue
            best = max(meeting, key=lambda n: summary(layout, n)["output_throughput"])
            run = summary(layout, best)
            per_gpu[layout] = run["output_throughput"] / gpus
            words.append(f"{layout}: {best} clients ({best / gpus:.1f} a GPU), {per_gpu[layout]:.0f} tok/s per GPU "
                         f"(mean TTFT {run['mean_ttft_ms']:.0f} ms, TPOT {run['mean_tpot_ms']:.1f} ms)")
        gain = per_gpu["disaggregated"] / per_gpu["aggregated"] if per_gpu["aggregated"] > 0 else None
        out.append((gain, f"ISL {sweep.input_len:,} / OSL {sweep.output_len}, {sweep.requests_per_client} requests a "
                          f"client from an idle deployment, SLA mean TTFT <= {sla.ttft_ms:g} ms and TPOT <= "
                          f"{sla.tpot_ms:.2f} ms, the best concurrency of each layout: " + "; ".join(words)))
    return out


def _meets_sla(summary: Callable[[str, int], dict[str, Any]], layout: str, sla: GoodputGain, concurrency: int) -> bool:
    """Whether ``layout`` served ``concurrency`` clients with every request done within the SLA's mean TTFT and
    TPOT."""
    run = summary(layout, concurrency)
    return run["failed"] == 0 and run["mean_ttft_ms"] <= sla.ttft_ms and run["mean_tpot_ms"] <= sla.tpot_ms
