"""The layer streamer: submit each layer's writes as soon as the forward pass finished that layer.

The prefill side's ``on_step`` hook (main thread, before the forward pass) queues one `StepWork`
per step: the step's id and the page ranges of each request it fills. A streamer thread waits on
the engine's `LayerCounter` for layer 0, 1, ... of that step and calls ``submit_layer`` for each,
then ``finish`` once every layer is submitted. It never touches jobs itself: the two callbacks are
the prefill side's, so this module is only about *when*, and tests drive it with a fake counter.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

# how often a waiting streamer looks whether it was stopped
STOP_CHECK_S = 0.5

Item = TypeVar("Item")  # the prefill side's per-request page range; opaque here


class LayerClock(Protocol):
    """What the streamer reads of the engine: `disaggsdk.engine.layer_counter.base.AnyLayerCounter`."""

    def wait(self, step_id: int, layers_done: int, timeout_s: float | None = None) -> bool:
        """Block until step ``step_id`` has ``layers_done`` layers (or a later step began)."""


@dataclass(frozen=True)
class StepWork(Generic[Item]):
    """The writes one step makes possible: ``items`` are the prefill side's page ranges (a
    `prefill_job.PageRange` per request); the streamer passes them back untouched."""

    step_id: int
    items: list[Item]


class LayerStreamer(Generic[Item]):
    """One thread that submits a step's writes layer by layer, in step order.

    Args:
        clock: the engine's layer counter.
        num_layers: layers per forward pass.
        submit_layer: ``submit_layer(items, layer_id)``: post that layer's writes (streamer thread).
        finish: ``finish(items)``: every layer of the step is submitted.
        name: the thread's name.
    """

    def __init__(self, clock: LayerClock, num_layers: int, submit_layer: Callable[[list[Item], int], None],
                 finish: Callable[[list[Item]], None], name: str = "streamer"):
        self.clock, self.num_layers = clock, num_layers
        self._submit_layer, self._finish = submit_layer, finish
        self._work: queue.Queue[StepWork[Item] | None] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, work: StepWork[Item]) -> None:
        """Queue a step's work (main thread, before the step's forward pass begins)."""
        self._work.put(work)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (work not yet submitted is dropped: the caller fails those jobs)."""
        self._stop.set()
        self._work.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            work = self._work.get()
            if work is None:
                return
            for layer in range(self.num_layers):
                while not self.clock.wait(work.step_id, layer + 1, timeout_s=STOP_CHECK_S):
                    if self._stop.is_set():
                        return
                self._submit_layer(work.items, layer)
            self._finish(work.items)
