"""The router's book of requests in flight: one record per request, and the index of which unit holds which."""

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.serve.routing.request_state import RequestBook, RequestState


def state(events: list) -> RequestState:
    return RequestState(events.append, b"fp", "10.0.0.1", traced=False, start=([1, 2, 3], SamplingParams(max_tokens=4)))


def test_a_request_is_held_by_one_unit_at_a_time_and_ends_with_one_pop():
    book = RequestBook(["decode-0", "decode-1"])
    a, b = state([]), state([])
    book.add("a", a, "decode-0")
    book.add("b", b, "decode-0")
    assert sorted(book.held_by("decode-0")) == ["a", "b"] and book.num_held("decode-1") == 0
    book.place(a, "a", "decode-1")  # moved
    assert book.held_by("decode-0") == ["b"] and book.held_by("decode-1") == ["a"] and a.unit == "decode-1"
    book.place(b, "b", None)  # its unit died: between units until a resubmit places it
    assert book.num_held("decode-0") == 0 and "b" in book and book.ids() == ["a", "b"]
    assert book.pop("a") is a and book.pop("a") is None
    assert "a" not in book and book.num_held("decode-1") == 0 and book.ids() == ["b"]


def test_a_request_has_started_once_its_prompt_is_let_go():
    s = state([])
    assert not s.started
    s.start = None
    assert s.started


def test_pop_all_ends_every_request_oldest_first():
    book = RequestBook(["decode-0"])
    for rid in ("x", "y", "z"):
        book.add(rid, state([]), "decode-0")
    assert list(book.pop_all()) == ["x", "y", "z"]
    assert book.ids() == [] and book.num_held("decode-0") == 0
