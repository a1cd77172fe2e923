"""Scheduler: token budget, chunked prefill, decode-first order, preemption, abort, modes."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.engine.scheduler import Scheduler
from disaggsdk.engine.sequence import Request, RequestStatus
from disaggsdk.kv.page_allocator import PageAllocator


def req(rid: str, n: int) -> Request:
    return Request(rid, list(range(n)), SamplingParams(max_tokens=8))


def advance(sched: Scheduler, out, token: int = 1) -> None:
    """What the engine does after a step: count computed tokens, append a sampled token."""
    for c in out.chunks:
        c.request.num_computed_tokens += c.num_tokens
        if c.sample:
            c.request.output_ids.append(token)


def test_chunked_prefill_respects_budget_and_decodes_go_first():
    s = Scheduler(PageAllocator(64), page_size=4, max_num_batched_tokens=8)
    a, b = req("a", 10), req("b", 5)
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert [(c.request.request_id, c.start_pos, c.num_tokens, c.sample) for c in out.chunks] == [("a", 0, 8, False)]
    assert len(out.chunks[0].page_ids) == 2
    advance(s, out)
    out = s.schedule()
    assert [(c.request.request_id, c.start_pos, c.num_tokens, c.sample) for c in out.chunks] == [
        ("a", 8, 2, True), ("b", 0, 5, True)]
    assert out.chunks[0].token_ids == [8, 9]
    advance(s, out)
    out = s.schedule()  # both decode now
    assert [(c.request.request_id, c.start_pos, c.num_tokens) for c in out.chunks] == [("a", 10, 1), ("b", 5, 1)]


def test_preemption_frees_pages_and_recomputes_everything():
    alloc = PageAllocator(3)
    s = Scheduler(alloc, page_size=4, max_num_batched_tokens=64)
    a, b = req("a", 4), req("b", 4)
    s.add(a)
    s.add(b)
    advance(s, s.schedule())  # both prefilled, 1 page each, 1 token sampled each
    out = s.schedule()  # a takes the 3rd page; b needs a 4th -> b preempted (it is the newest)
    assert [c.request.request_id for c in out.chunks] == ["a"]
    assert out.preempted_ids == ["b"]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    assert alloc.page_ids("b") == [] and b.num_preemptions == 1
    advance(s, out)
    s.finish(a, "stop")
    out = s.schedule()  # b recomputes prompt + its output token, then samples again
    assert [(c.request.request_id, c.start_pos, c.num_tokens, c.sample) for c in out.chunks] == [("b", 0, 5, True)]
    assert alloc.num_free_pages == 1


def test_pinned_requests_are_never_preempted():
    alloc = PageAllocator(3)
    s = Scheduler(alloc, page_size=4, max_num_batched_tokens=64)
    p = Request("p", list(range(8)), SamplingParams())  # KV of prompt[:-1] arrived in 2 pages
    alloc.allocate("p", 2, pinned=True)
    p.num_computed_tokens = 7
    s.add_running(p)
    q = req("q", 4)
    s.add(q)
    advance(s, s.schedule())
    assert p.num_computed_tokens == 8 and q.num_computed_tokens == 4
    out = s.schedule()  # p needs a 3rd page, q holds it: q goes, p stays
    assert out.preempted_ids == ["q"] and [c.request.request_id for c in out.chunks] == ["p"]


def test_abort_and_prefill_only_mode():
    alloc = PageAllocator(8)
    s = Scheduler(alloc, page_size=4, max_num_batched_tokens=64, mode="prefill_only")
    a = req("a", 9)
    s.add(a)
    out = s.schedule()
    assert [(c.num_tokens, c.sample) for c in out.chunks] == [(8, False)]  # prompt[:-1], no sampling
    advance(s, out)
    assert s.target_tokens(a) == a.num_computed_tokens
    s.finish(a, "prefilled", keep_pages=True)
    assert alloc.page_ids("a") and not s.has_unfinished()
    alloc.free("a")
    b = req("b", 3)
    s.add(b)
    advance(s, s.schedule())
    s.finish(b, "abort")
    assert alloc.num_free_pages == 8


def test_max_num_seqs_limits_admission():
    s = Scheduler(PageAllocator(64), page_size=4, max_num_batched_tokens=64, max_num_seqs=2)
    for i in range(3):
        s.add(req(str(i), 3))
    out = s.schedule()
    assert [c.request.request_id for c in out.chunks] == ["0", "1"]
