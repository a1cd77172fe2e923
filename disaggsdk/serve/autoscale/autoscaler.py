"""`serve.autoscale` at work: a thread that reads the served requests' SLO attainment every second,
asks `autoscale_policy` whether a role is short, previews the change with the simulator
(`autoscale_preview`) and, unless the preview predicts a loss, applies it (`rebalance`).

Every decision -- applied, refused by the preview, or failed -- is kept (`Autoscaler.decisions`,
`Deployment.autoscale_decisions`), logged through ``say`` (the launch's progress lines), counted on
`/metrics` (``disaggsdk_autoscale_decisions_total{change, applied}``, with the units per role as
``disaggsdk_autoscale_units{role}``) and shown in the live views.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disaggsdk.errors import DisaggError
from disaggsdk.serve.autoscale.autoscale_policy import Layout, propose, recent_window, window_stats
from disaggsdk.serve.autoscale.autoscale_preview import Preview, preview
from disaggsdk.serve.moves.rebalance import rebalance
from disaggsdk.serve.moves.request_moves import MoveError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter

    from disaggsdk.serve.backend import LaunchedUnits
    from disaggsdk.serve.metrics import ServedRequest

TICK_S = 1.0
MAX_DECISIONS = 256


@dataclass(frozen=True)
class AutoscaleDecision:
    """One decision of the policy.

    Attributes:
        at_s: when (``time.time()``).
        before, after: the layouts ("P1:D2").
        reason: what the window showed.
        predicted: the simulator's attainment on each layout (None: no preview; ``preview_note`` says why).
        applied: whether the units changed role.
        outcome: "" when applied; else why not (the preview predicts a loss, a unit could not move).
        moved: decoding requests the change moved to other decode units with their KV.
    """

    at_s: float
    before: str
    after: str
    reason: str
    predicted: Preview | None
    preview_note: str
    applied: bool
    outcome: str = ""
    moved: int = 0

    def line(self) -> str:
        """The decision as one log line."""
        pred = (f"; simulator: {self.predicted.before:.0%} -> {self.predicted.after:.0%} attainment"
                if self.predicted is not None else f"; no preview ({self.preview_note})")
        verdict = (f"applied ({self.moved} decoding request(s) moved with their KV)" if self.applied
                   else f"not applied: {self.outcome}")
        return f"autoscale {self.before} -> {self.after}: {self.reason}{pred}; {verdict}"


class Autoscaler:
    """The policy's clock over a router (see the module doc).

    Args:
        router: the deployment's router (roles, drains, role changes).
        served: the front end's recent finished requests (`ServerMetrics.recent`).
        registry: where its Prometheus series go (None: none).
        say: where its log lines go.
        model_name: the ``model_name`` label of its series.
    """

    def __init__(self, router: LaunchedUnits, served: Callable[[], list[ServedRequest]],
                 registry: CollectorRegistry | None = None, say: Callable[[str], None] = print,
                 model_name: str = ""):
        self.router, self.served, self.say = router, served, say
        self.spec = router.spec
        self.config = router.spec.serve.autoscale
        self.decisions: list[AutoscaleDecision] = []
        self._last_change_s = time.monotonic()  # the window starts with the layout in place
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autoscaler", daemon=True)
        self._decided: Counter | None = None
        self._model_name = model_name
        if registry is not None:
            from prometheus_client import Counter, Gauge

            self._decided = Counter("disaggsdk_autoscale_decisions", "Role changes the autoscale policy decided, by "
                                    "change and whether it was applied.", ["model_name", "change", "applied"],
                                    registry=registry)
            units = Gauge("disaggsdk_autoscale_units", "Units serving each role now.", ["model_name", "role"],
                          registry=registry)
            for role in ("prefill", "decode"):
                units.labels(model_name, role).set_function(self._counter_of(role))

    def _counter_of(self, role: str) -> Callable[[], float]:
        return lambda: float(sum(r == role for r in self.router.unit_roles().values()))

    def layout(self) -> Layout:
        """How many units prefill and decode now."""
        roles = list(self.router.unit_roles().values())
        return Layout(roles.count("prefill"), roles.count("decode"))

    def start(self) -> Autoscaler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(TICK_S) and not self.router.closed:
            try:
                self.tick()
            except Exception as exc:  # noqa: BLE001 - a failed round is logged; the next one tries again
                self.say(f"autoscale: a round failed: {type(exc).__name__}: {exc}")

    def tick(self, now_s: float | None = None) -> AutoscaleDecision | None:
        """One round: decide, preview, apply. Returns the decision made (None: nothing to change)."""
        now_s = time.monotonic() if now_s is None else now_s
        if now_s - self._last_change_s < self.config.cooldown_s:
            return None
        window = recent_window(self.served(), now_s, self.config, self._last_change_s)
        overdue = self.router.num_waiting_past(self.config.ttft_ms / 1e3, since_s=self._last_change_s)
        proposal = propose(window_stats(window, self.config, overdue), self.layout(), self.config)
        if proposal is None:
            return None
        predicted, note = None, ""
        try:
            predicted = preview(self.spec, window, proposal, self.config)
        except (DisaggError, ValueError, KeyError, OSError) as exc:
            note = str(exc)
        moved = 0
        if predicted is not None and not predicted.gains:
            applied, outcome = False, "the simulator predicts a loss"
        else:
            try:
                report = rebalance(self.router, proposal.after.prefill, proposal.after.decode)
            except MoveError as exc:  # refused as it stands (a unit down, the last routable one, an operator's rebalance)
                applied, outcome = False, str(exc)
            else:
                applied = report.done
                outcome = "" if applied else "; ".join(c.reason for c in report.changes if not c.done)
                moved = sum(m.moved for c in report.changes for m in c.moves)
        decision = AutoscaleDecision(time.time(), str(proposal.before), str(proposal.after), proposal.reason,
                                     predicted, note, applied, outcome, moved)
        self._last_change_s = time.monotonic()  # applied or not: the next judgement waits for a fresh window
        self.decisions = [*self.decisions[-MAX_DECISIONS + 1:], decision]
        if self._decided is not None:
            self._decided.labels(self._model_name, f"{decision.before}->{decision.after}",
                                 "true" if applied else "false").inc()
        self.say(decision.line())
        return decision
