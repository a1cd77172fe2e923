"""A unit's spans of its traced requests: handoff first, then the scheduler wait and each step, capped."""

from __future__ import annotations

from dataclasses import dataclass

from disaggsdk.launch.unit_process.spans import MAX_STEP_SPANS, UnitSpans
from disaggsdk.records.span_records import RequestSpanRecords, SpanRecord


@dataclass
class Output:  # the fields of an engine `RequestOutput` the spans read
    request_id: str
    new_token_ids: list[int]


def test_steps_follow_the_handoff_and_past_the_cap_become_one_span():
    spans = UnitSpans()
    assert not spans
    spans.begin("r", 100)
    spans.begin("other", 100)
    assert spans
    assert spans.merge(RequestSpanRecords("r", 110, 200, [SpanRecord("kv handoff", 110, 200),
                                                          SpanRecord("admit", 190, 200, 0)]))
    assert not spans.merge(RequestSpanRecords("untraced", 0, 1))
    t = 300
    for _ in range(MAX_STEP_SPANS + 5):
        spans.step([Output("r", [7]), Output("other", []), Output("x", [1])], t, t + 10)
        t += 20
    record = spans.finish("r", t)
    assert record is not None and spans.finish("r", t) is None
    names = [s.name for s in record.spans]
    assert names[:4] == ["kv handoff", "admit", "wait for scheduler", "first step"]
    assert record.spans[1].parent == 0
    assert (record.spans[2].start_ns, record.spans[2].end_ns) == (200, 300)  # admitted -> first step
    assert names.count("decode step") == MAX_STEP_SPANS - 1
    rest = record.spans[-1]
    assert rest.name == "decode steps (aggregated)" and rest.attributes == {"num_steps": 5}
    assert record.spans[3].attributes == {"batch_size": 3, "num_tokens": 1}
    spans.drop("other")
    assert not spans
