"""`disaggsdk compare` and `Cluster.compare`: which layout, for my trace and my SLOs, here and at scale.

The work is `calibrate.layout_compare`'s; this module resolves what a person gives (a trace by path
or by the name of a shipped one, the target specs, this machine's profile, calibrating it first
when it was never calibrated) and wraps the answer for a terminal or a notebook.
"""

from __future__ import annotations

import html
import logging
import os
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from disaggsdk.errors import DisaggError, printable

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from disaggsdk.bench.trace_dataset import TraceDraws
    from disaggsdk.face.deployment import Deployment
    from disaggsdk.records.goodput_records import Comparison, LayoutGoodput
    from disaggsdk.sim.hardware import HardwareProfile
    from disaggsdk.spec import Spec

# the traces shipped in the package (bench/traces/), by the name a person types
SHIPPED_TRACES = {"code-assistant": "code_assistant.jsonl"}

launch_log = logging.getLogger("disaggsdk.launch")


def quiet_launch(spec: Spec, *, colocated: bool, port: int) -> Deployment:
    """`disaggsdk.face.deployment.launch` whose units' start-up lines (loading, compiling, ready) go to the
    ``disaggsdk.launch`` logger, not the output: a comparison starts a deployment for every layout and
    calibration turn, a dozen start-ups of ten lines each on a first run. Failures and restarts are
    still said (the runtime's ``on_event``: stderr)."""
    from disaggsdk.face.deployment import launch

    return launch(spec, colocated=colocated, port=port, on_progress=lambda line: launch_log.info("%s", line))


def trace_path(trace: str | Path) -> Path:
    """A trace file: a path, or the name of a shipped trace (`SHIPPED_TRACES`).

    Raises:
        DisaggError: neither a file nor a shipped trace's name.
    """
    if str(trace) in SHIPPED_TRACES:
        return Path(str(resources.files("disaggsdk.bench") / "traces" / SHIPPED_TRACES[str(trace)]))
    path = Path(trace)
    try:
        is_file = path.is_file()
    except OSError:  # a name too long to be a path
        is_file = False
    if not is_file:
        raise DisaggError(f"trace {printable(str(trace))}: no such file, and not a shipped trace ({', '.join(SHIPPED_TRACES)}); "
                          f"give a JSON-lines file of {{\"input_len\" or \"prompt\", \"output_len\"}} lines, or a "
                          f"ShareGPT JSON file")
    return path


def machine_profile(spec: Spec, recalibrate: bool = False, say: Callable[[str], None] = print) -> HardwareProfile:
    """This machine's ``cpu-local`` profile, calibrated first (engine timing and the serving stack on
    ``spec``, saved for the next time) when there is none with the serving stack's costs, or when asked.
    """
    from disaggsdk.sim.hardware import load_profile, user_profile_dir

    path = user_profile_dir() / "cpu-local.yaml"
    if path.is_file() and not recalibrate:
        profile = load_profile(path)
        if profile.frontend_cpu_ms_per_token > 0:  # the serving stack was fitted too
            return profile
    from disaggsdk.calibrate.engine_profile import save_profile
    from disaggsdk.calibrate.serving import calibrate_machine

    say(f"calibrating this machine first (`disaggsdk calibrate --deployment` on {spec.label}; a few minutes, "
        f"saved to {path})")
    profile, _, _, _ = calibrate_machine(spec.model, spec, launch=quiet_launch)
    save_profile(profile, path)
    return profile


def _trace_draws(trace: Path, model: str) -> TraceDraws:
    """The draws of ``trace``, a JSON-lines trace or a ShareGPT file (text counted in ``model``'s
    tokenizer, as bench counts it)."""
    from disaggsdk.bench.trace_dataset import TraceDraws, trace_lengths

    if trace.suffix == ".jsonl" and all(n is not None for n, _ in trace_lengths(trace)):
        return TraceDraws(trace)  # lengths and ids: no tokenizer to load
    from disaggsdk.engine.tokenizer import ByteTokenizer, load_tokenizer

    tokenizer = load_tokenizer(model) or ByteTokenizer()
    return TraceDraws(trace, lambda text: len(tokenizer.encode(text)))


@attrs.frozen
class LayoutComparison:
    """A comparison's answer (`calibrate.layout_compare.Comparison` as ``result``): a table and the
    plots in a notebook, `figure` and `save_plot` for files."""

    result: Comparison
    # what each of `rows`' cells is
    HEADERS = ("layout", "where", "measured goodput req/s", "simulated req/s", "sim error", "limited by")

    @property
    def recommendation(self) -> list[str]:
        """The layout to choose on this machine, then at each target, each with its reason."""
        return [self.result["recommendation"], *(t["recommendation"] for t in self.result["targets"])]

    def rows(self) -> list[tuple[str, str, str, str, str, str]]:
        """A row per layout, its cells as `HEADERS` names them (measured and simulated goodput, the
        simulator's error, what limited it)."""
        out = []
        places: list[tuple[str, Sequence[LayoutGoodput]]] = [("this machine", self.result["this_machine"])]
        places += [(f"{t['spec']} on {t['profile']}", t["layouts"]) for t in self.result["targets"]]
        from disaggsdk.bench.goodput_sweep import limit_text

        for where, layouts in places:
            for r in layouts:
                measured = r["measured"]
                sweep = measured or r["simulated"]
                error = r["simulated_error"]
                out.append((r["layout"], where,
                            f"{measured['goodput_request_rate']:.2f}" if measured else "-",
                            f"{r['simulated']['goodput_request_rate']:.2f}",
                            f"{error:+.0%}" if error is not None else "-",
                            limit_text(sweep["limited_by"]) if sweep["limited_by"] else "met the SLOs flat out"))
        return out

    def figure(self) -> Figure:
        """Attainment against rate and TTFT against TPOT, per layout (`report.layout_plots`)."""
        from disaggsdk.report.layout_plots import comparison_figure

        return comparison_figure(self.result)

    def save_plot(self, path: str | Path) -> Path:
        """The plots as .png, .svg or .html (the table and the recommendation above the plots)."""
        from disaggsdk.report.layout_plots import save_figure

        return save_figure(self.figure(), path, self._table_html())

    def _table_html(self) -> str:
        slos = ", ".join(f"{k.upper()} {v:g} ms" for k, v in self.result["slos_ms"].items())
        head = "".join(f"<th>{h}</th>" for h in self.HEADERS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in self.rows())
        advice = "".join(f"<li>{html.escape(line)}</li>" for line in self.recommendation)
        return (f"<p>goodput: the highest rate at which {self.result['slo_attainment_target']:.0%} of requests met "
                f"{html.escape(slos)}</p><table><tr>{head}</tr>{body}</table><ul>{advice}</ul>")

    def _repr_html_(self) -> str:
        from disaggsdk.report.layout_plots import png_base64

        return self._table_html() + f"<img src='data:image/png;base64,{png_base64(self.figure(), dpi=90)}'>"


def compare(trace: str | Path, slos_ms: dict[str, float], targets: Sequence[Spec] = (), *,
            machine: Spec | None = None, goodput_target: float = 0.9, search_steps: int = 4, rounds: int = 1,
            num_prompts: int = 40, seed: int = 0, local_prefill_tokens: int = 512, cores: int | None = None,
            recalibrate: bool = False, profile: HardwareProfile | None = None, only: Sequence[str] = (),
            say: Callable[[str], None] = print) -> LayoutComparison:
    """Measure each layout that fits this machine on ``trace`` for its goodput under ``slos_ms``, beside
    the simulator's figure for the same runs; then simulate each target spec's layouts at its scale.

    Args:
        trace: a JSON-lines trace (`bench.trace_dataset`) or a shipped trace's name (``code-assistant``).
        slos_ms: e.g. ``{"ttft": 1000, "tpot": 50}``.
        targets: specs to simulate at their own scale (GPU specs: their hardware's profile).
        machine: the CPU spec measured here (default: the first target's `machine_spec`, else the
            tiny qwen3-coder's).
        cores: units to run here (default: the cores this process may use).
        profile: this machine's profile (default: ``cpu-local``, calibrated first if it never was).
        only: measure only these of this machine's layouts, by name (``P1:D1``) or kind (``colocated``,
            ``disaggregated``, ``conditional``); empty: all.
    Raises:
        DisaggError: a bad trace, SLOs, sweep settings or spec.
    """
    from disaggsdk.bench.goodput_sweep import RateSweep, SweepError
    from disaggsdk.calibrate.layout_compare import compare_layouts, machine_layouts, machine_spec
    from disaggsdk.spec import Spec

    if not slos_ms:
        raise SweepError("compare needs SLOs to attain, e.g. ttft=1000,tpot=50 (ms)")
    path = trace_path(trace)
    here = machine or machine_spec(targets[0] if targets else Spec())  # Spec(): qwen3-coder, whose tiny twin runs here
    sweep = RateSweep(target=goodput_target, search_steps=search_steps, rounds=rounds)
    layouts = machine_layouts(here, cores or len(os.sched_getaffinity(0)), local_prefill_tokens)
    if only:
        unknown = [name for name in only if not any(name in (layout.name, layout.kind) for layout in layouts)]
        if unknown:
            raise DisaggError(f"no layout {', '.join(unknown)} here; the layouts are "
                              f"{', '.join(layout.name for layout in layouts)} (or a kind: colocated, "
                              f"disaggregated, conditional)")
        layouts = [layout for layout in layouts if layout.name in only or layout.kind in only]
    draws = _trace_draws(path, here.model)
    draws(seed, 1)  # a bad trace fails now, not after a calibration
    disaggregated = [layout for layout in layouts if not layout.colocated] or layouts
    profile = profile or machine_profile(disaggregated[0].spec, recalibrate, say)
    result = compare_layouts(layouts, draws, sweep, slos_ms, profile, launch=quiet_launch, num_prompts=num_prompts,
                             seed=seed, targets=[t for t in targets if t.device != "cpu"], on_run=say)
    return LayoutComparison(result)
