"""A unit's prefix caching figures reach the router: cached tokens in `Tokens`, the prefix cache and
not-sent counters in `UnitStats`, through the channel's msgpack and into `InstanceStats`."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import msgspec

from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.parallel import TensorParallel
from disaggsdk.engine.speculative.stats import SpecStats
from disaggsdk.launch import messages as ch
from disaggsdk.launch.unit_process.unit import Unit
from disaggsdk.messenger.stats import TransferTotals
from disaggsdk.records.unit_counters import UnitCounters
from disaggsdk.serve.routing.unit_gauges import instance_stats


class Conn:
    def __init__(self):
        self.sent = []

    def send(self, msg):
        self.sent.append(msg)


def unit(role: str, totals: TransferTotals | None) -> Unit:
    """A `Unit` over fakes: only what `_stats` and `_emit` read."""
    scheduler = SimpleNamespace(waiting=[], running=[1], num_preemptions=2,
                                prefix_cache=SimpleNamespace(queries=96, hits=64, tier_hits=0, tiers=None))
    # a pool of 41 pages of which requests may hold 40 (a CUDA engine's graphs keep one as scratch)
    engine = SimpleNamespace(scheduler=scheduler, kv=SimpleNamespace(num_free_pages=30, num_pages=40),
                             config=SimpleNamespace(num_pages=41),
                             spec_stats=SpecStats(), runner=SimpleNamespace(tp=TensorParallel()), lockstep=None)
    engine.counters = functools.partial(LLMEngine.counters, engine)  # the engine's own reading of its counters
    messenger = None if totals is None else SimpleNamespace(
        totals=totals, num_waiting=0, frames=SimpleNamespace(by_reason={}), rejected={}, open_grant_keys=5)
    u = Unit.__new__(Unit)
    u.args, u.conn, u.engine, u.messenger = SimpleNamespace(name=f"{role}-0", role=role), Conn(), engine, messenger
    # the transport's open immediate counters (a gauge in the stats)
    u.transfer = None if totals is None else SimpleNamespace(num_open_counters=2)
    # which prefill unit computed a request's prompt (the messenger's record, read once per request)
    prefilled_by = {"r": "prefill-1"}
    u.parts = SimpleNamespace(prefill_unit_of=lambda request_id: prefilled_by.pop(request_id, ""))
    return u


def round_trip(msg):
    return ch.FROM_UNIT.decode(msgspec.msgpack.encode(msg))


def test_a_decode_units_stats_carry_the_prefix_cache_and_not_sent_counters():
    totals = TransferTotals(UnitCounters(pages_not_sent=12, bytes_not_sent=49152, requests_fully_cached=1,
                                        requests_prefilled_short=3))
    sent = round_trip(unit("decode", totals)._stats(seq=3, with_recent=False))
    snapshot = instance_stats("decode-0", "decode", True, sent)
    for c in (sent.counters, snapshot.counters):
        assert (c.prefix_cache_queries, c.prefix_cache_hits, c.num_preemptions) == (96, 64, 2)
        assert (c.pages_not_sent, c.bytes_not_sent, c.requests_fully_cached, c.requests_prefilled_short) == (12, 49152, 1, 3)
    assert snapshot.counters.prefix_cache_hit_rate == 64 / 96
    assert sent.open_grant_keys == snapshot.kv_grant_keys_open == 5  # the grants its messenger holds open now
    assert sent.open_counters == 2  # the immediate counters its transport expects writes for


def test_a_unit_without_a_messenger_or_a_snapshot_reports_zeros():
    sent = round_trip(unit("mixed", None)._stats(seq=0, with_recent=False))
    assert (sent.num_free_pages, sent.num_pages) == (30, 40)  # pages requests can hold, not the pool's
    assert sent.open_counters == 0  # no transport
    assert (sent.counters.prefix_cache_queries, sent.counters.pages_not_sent, sent.counters.requests_fully_cached) == (96, 0, 0)
    empty = instance_stats("decode-1", "decode", False, None).counters
    assert (empty.prefix_cache_queries, empty.bytes_not_sent, empty.prefix_cache_hit_rate) == (0, 0, None)


def test_tokens_carry_the_requests_cached_tokens_and_its_prefill_unit_once():
    u = unit("decode", None)
    out = SimpleNamespace(request_id="r", new_token_ids=[5], finished=False, finish_reason=None, error=None,
                          new_logprobs=[], prompt_logprobs=None, num_cached_tokens=32)
    u._emit([out])
    u._emit([out])
    first, second = (round_trip(m) for m in u.conn.sent)
    assert (first.num_cached_tokens, first.prefill_unit) == (32, "prefill-1")
    assert second.prefill_unit == ""  # the access log names it from the first tokens
    assert round_trip(ch.Tokens("r", [1])).num_cached_tokens == 0  # default: nothing cached
