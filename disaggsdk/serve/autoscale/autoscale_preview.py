"""The simulator's preview of a role change: the window's requests replayed on the layout in place and
on the proposed one (`sim.simulator.Simulation`, calibrated on this machine: the ``cpu-local`` profile that
`disaggsdk calibrate` fits), each with its predicted SLO attainment.

The replay is of what the window saw finish (arrival gaps, prompt and output lengths); requests still
queued are not in it, so under a growing backlog the preview sees less load than there is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from disaggsdk.serve.autoscale.autoscale_policy import Layout, Proposal
    from disaggsdk.serve.metrics import ServedRequest
    from disaggsdk.spec.serving import Autoscale
    from disaggsdk.spec.types import Spec


@dataclass(frozen=True)
class Preview:
    """Predicted SLO attainment (every SLO met) of the window's requests on each layout."""

    before: float
    after: float

    @property
    def gains(self) -> bool:
        """Whether the proposed layout is predicted to do at least as well."""
        return self.after >= self.before


def layout_spec(spec: Spec, layout: Layout) -> Spec:
    """``spec`` with ``layout``'s counts of prefill and decode instances (shapes unchanged)."""
    return attrs.evolve(spec, prefill=attrs.evolve(spec.prefill, replicas=layout.prefill),
                        decode=attrs.evolve(spec.decode, replicas=layout.decode))


def preview(spec: Spec, window: list[ServedRequest], proposal: Proposal, config: Autoscale) -> Preview:
    """Replay ``window`` on ``proposal``'s layouts.

    Raises:
        ValueError: a layout the simulator cannot hold (no prefill instance), or an empty window.
        SpecError, KeyError: the spec's profile or shape does not simulate.
    """
    from disaggsdk.sim.hardware import load_profile
    from disaggsdk.sim.machine_config import machine_sim_config
    from disaggsdk.sim.runner import default_profile_name
    from disaggsdk.sim.simulator import Simulation
    from disaggsdk.sim.workload import SimRequest

    if not window:
        raise ValueError("no finished request to replay")
    if min(proposal.before.prefill, proposal.after.prefill) < 1:
        raise ValueError("the simulator models disaggregated layouts with at least one prefill instance")
    first = min(r.timeline.sent_s for r in window)
    requests = [SimRequest(i, r.timeline.sent_s - first, max(1, r.timeline.prompt_tokens),
                           max(1, r.timeline.output_tokens))
                for i, r in enumerate(sorted(window, key=lambda r: r.timeline.sent_s))]
    profile = load_profile(default_profile_name(spec))
    slos = {"ttft": config.ttft_ms, "tpot": config.tpot_ms}
    attainment = []
    for layout in (proposal.before, proposal.after):
        shaped = layout_spec(spec, layout)
        summary = Simulation(shaped, machine_sim_config(shaped, profile, slos_ms=slos, client_shares_cores=False)
                             ).run(requests)
        attainment.append(float(summary["slo_attainment"]))
    return Preview(attainment[0], attainment[1])
