"""Run a batch of prompts through a router's `submit` to completion, for callers without an event loop."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from disaggsdk.launch.tiny import LaunchError
from disaggsdk.serve.backend import TokenEvent


def run_batch(submit: Callable[..., str], ids: Sequence[str], prompts: Sequence[Sequence[int]], params: Any,
              timeout_s: float) -> list[list[TokenEvent]]:
    """Submit every prompt under its id and wait for all to finish; returns each one's events in order.

    Args:
        submit: `Router.submit`.
        params: one `SamplingParams` for all prompts, or one per prompt.
    Raises:
        LaunchError: a request did not finish within ``timeout_s``.
    """
    params_list = params if isinstance(params, (list, tuple)) else [params] * len(prompts)
    done: queue.Queue = queue.Queue()
    events: dict[str, list[TokenEvent]] = {}

    def sink_for(rid: str) -> Callable[[TokenEvent], None]:
        def sink(ev: TokenEvent) -> None:
            events.setdefault(rid, []).append(ev)
            if ev.finished:
                done.put(rid)
        return sink

    for rid, prompt, p in zip(ids, prompts, params_list):
        submit(rid, prompt, p, sink_for(rid))
    deadline = time.monotonic() + timeout_s
    finished = set()
    while len(finished) < len(ids):
        try:
            finished.add(done.get(timeout=max(0.0, deadline - time.monotonic())))
        except queue.Empty:
            raise LaunchError(f"{len(ids) - len(finished)} requests did not finish in {timeout_s} s") from None
    return [events[rid] for rid in ids]
