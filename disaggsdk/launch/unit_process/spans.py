"""The phases of the traced requests a unit's engine runs, until the unit sends them (`RequestSpans`).

A request is traced when its `Generate` says so (the router traces it: `serve.tracing.request_tracing`);
nothing is recorded for any other, so a deployment without tracing reads no clock here. A decode
unit's record starts with its messenger's handoff spans (`messenger.decode_side.handoff_spans`), then
the wait for the scheduler, the first step that produced a token for it and each later step (one span
each up to `MAX_STEP_SPANS`, the rest as one aggregated span with their count), and is sent when the
request finishes. The unit's main thread alone uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disaggsdk.messenger.span_log import SpanLog
from disaggsdk.records.span_records import RequestSpanRecords

if TYPE_CHECKING:
    from disaggsdk.engine.sequence import RequestOutput

# decode steps recorded one span each; a long generation's later steps become one span (a trace of
# 4,000 spans per request would cost the exporter more than the request)
MAX_STEP_SPANS = 64


@dataclass
class _Traced:
    log: SpanLog
    ready_ns: int  # when the engine got it (its KV arrived); its arrival until then
    num_steps: int = 0
    rest_start_ns: int = 0  # the steps past MAX_STEP_SPANS: from, to, how many
    rest_end_ns: int = 0
    num_rest: int = 0


class UnitSpans:
    """The traced requests of one unit's engine (see the module doc)."""

    def __init__(self) -> None:
        self._traced: dict[str, _Traced] = {}

    def __bool__(self) -> bool:
        """Whether any request here is traced (the loop reads clocks around a step only then)."""
        return bool(self._traced)

    def begin(self, request_id: str, now_ns: int) -> None:
        """A traced request reached the unit (``now_ns``: `time.time_ns()`)."""
        self._traced[request_id] = _Traced(SpanLog(request_id, now_ns), now_ns)

    def merge(self, record: RequestSpanRecords) -> bool:
        """Put the messenger's spans of a request in front of the unit's own; False: not traced here."""
        t = self._traced.get(record.request_id)
        if t is None:
            return False
        t.log.extend(record.spans)
        t.ready_ns = record.end_ns
        return True

    def step(self, outputs: Sequence[RequestOutput], start_ns: int, end_ns: int) -> None:
        """A step ran from ``start_ns`` to ``end_ns``: a span for each traced request it produced tokens for."""
        for out in outputs:
            t = self._traced.get(out.request_id)
            if t is None or not out.new_token_ids:
                continue
            if t.num_steps == 0:
                t.log.add("wait for scheduler", t.ready_ns, start_ns)
                t.log.add("first step", start_ns, end_ns, batch_size=len(outputs), num_tokens=len(out.new_token_ids))
            elif t.num_steps < MAX_STEP_SPANS:
                t.log.add("decode step", start_ns, end_ns, step=t.num_steps, batch_size=len(outputs),
                          num_tokens=len(out.new_token_ids))
            else:
                t.rest_start_ns = t.rest_start_ns or start_ns
                t.rest_end_ns, t.num_rest = end_ns, t.num_rest + 1
            t.num_steps += 1

    def finish(self, request_id: str, now_ns: int) -> RequestSpanRecords | None:
        """The finished request's record (None: not traced here); the unit forgets it."""
        t = self._traced.pop(request_id, None)
        if t is None:
            return None
        if t.num_rest:
            t.log.add("decode steps (aggregated)", t.rest_start_ns, t.rest_end_ns, num_steps=t.num_rest)
        return t.log.finish(now_ns)

    def drop(self, request_id: str) -> None:
        """Forget a request that ended without finishing here (aborted, refused, failed)."""
        self._traced.pop(request_id, None)
