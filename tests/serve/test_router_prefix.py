"""The router's `serve.routing` against the fake runtime: shared prefixes stay on one decode unit
under cache_aware, alternate under least_loaded, and a dead unit's prefixes are forgotten."""

from __future__ import annotations

import attrs
import pytest

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.launch import messages as ch
from disaggsdk.serve.routing.router import Router
from disaggsdk.spec import Spec
from tests.serve.test_router import FakeRuntime

PLAIN = SamplingParams()  # what a request without sampling options gets

PAGE = 16
SYSTEM = list(range(1000, 1000 + 8 * PAGE))  # a long shared prefix: 8 whole pages


def router_with(routing: str) -> tuple[FakeRuntime, Router]:
    rt = FakeRuntime({"prefill-0": "prefill", "decode-0": "decode", "decode-1": "decode"})
    spec = Spec(model="qwen3-coder-tiny")
    rt.spec = attrs.evolve(spec, serve=attrs.evolve(spec.serve, routing=routing),
                           kv=attrs.evolve(spec.kv, page_size=PAGE))
    return rt, Router(rt)


def submit(router: Router, rid: str, prompt: list[int]) -> str:
    return router.submit(rid, prompt, PLAIN, lambda ev: None)


def test_the_default_is_cache_aware():
    assert Spec().serve.routing == "cache_aware"


@pytest.mark.parametrize("routing, expected", [
    ("cache_aware", ["decode-0", "decode-0", "decode-1"]),
    ("least_loaded", ["decode-0", "decode-1", "decode-0"]),
])
def test_a_shared_long_prefix_stays_on_one_unit_only_under_cache_aware(routing, expected):
    rt, router = router_with(routing)
    units = [submit(router, "a", SYSTEM + [1, 2, 3]), submit(router, "b", SYSTEM + [4, 5, 6, 7]),
             submit(router, "c", list(range(50, 90)))]  # c shares nothing: the less busy unit
    assert units == expected
    assert [m.request_id for u, m in rt.sent if isinstance(m, ch.Generate) and u == expected[1]][-1] == "b"
    if routing == "cache_aware":
        assert (router.routing.last.target, router.routing.last.matched_pages) == ("decode-1", 0)


def test_the_shared_prefix_is_matched_page_by_page():
    _rt, router = router_with("cache_aware")
    submit(router, "a", SYSTEM + [1])
    assert submit(router, "b", SYSTEM[: 5 * PAGE + 3]) == "decode-0"
    assert (router.routing.last.matched_pages, router.routing.last.prompt_pages) == (5, 5)


def test_a_busy_unit_hands_its_prefix_on():
    _rt, router = router_with("cache_aware")
    units = [submit(router, f"r{i}", SYSTEM + [i]) for i in range(4)]
    assert units == ["decode-0", "decode-0", "decode-1", "decode-1"]  # 2 more in flight: a tie, the less busy


def test_a_dead_unit_is_forgotten_and_its_waiting_request_moves():
    rt, router = router_with("cache_aware")
    assert submit(router, "a", SYSTEM + [1]) == "decode-0"
    assert router.routing.policy.index.num_pages("decode-0") == 8
    rt.die("decode-0")
    assert router.routing.policy.index.num_pages("decode-0") == 0
    assert rt.sent[-1][0] == "decode-1" and rt.sent[-1][1].request_id == "a"  # moved, and routed there
    assert router.routing.policy.index.num_pages("decode-1") == 8
    rt.healthy["decode-0"] = True  # back, restarted with an empty cache
    assert submit(router, "b", SYSTEM + [2]) == "decode-1"  # the prefix follows the unit that has it now
    assert router.routing.last.matched_pages == 8


def test_a_prompt_that_cannot_be_hashed_is_routed_by_load():
    """Token ids over int64 have no page hash; the send (msgspec, in a real runtime) refuses them
    with a `LaunchError`, not the router with an OverflowError."""
    _rt, router = router_with("cache_aware")
    assert submit(router, "big", [1 << 70] * (2 * PAGE)) == "decode-0"
    assert router.routing.last.prompt_pages == 0
