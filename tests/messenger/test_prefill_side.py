"""The prefill side against fakes: admission, typed rejections, and a captured request replayed.

The request frames are real: a `DecodeMessenger` (with a fake transport that keeps the raw bytes)
grants pages and seals them; the prefill side opens them as it would off the wire.
"""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from disaggsdk.engine.layer_counter.host import LayerCounter
from disaggsdk.kv.block_hash import page_hashes
from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.context import context_bytes
from disaggsdk.messenger.decode_side import DecodeMessenger
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.messenger.prefill_job import ContextStaging
from disaggsdk.messenger.prefill_side import PrefillMessenger
from disaggsdk.plan import expected_writes, make_plan
from disaggsdk.transfer import RegionDescriptor
from tests.messenger._engine_pages import EnginePages
from tests.plan.helpers import make_spec

SECRET = b"prefill-side-test-secret-0123456"
NUM_PAGES, PAGE_SIZE, SLOTS = 16, 4, 4


class RawTransfer:
    """Keeps every frame as bytes, by peer; writes are never submitted in these tests."""

    def __init__(self):
        self.frames: list[tuple[str, bytes]] = []
        self.expected: list[tuple[int, int]] = []  # (imm, count) of each counter

    def add_peer(self, address: bytes) -> str:
        return address.decode()

    def send(self, peer: str, frame: bytes) -> Future:
        self.frames.append((peer, bytes(frame)))
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def expect(self, imm: int, count: int) -> Future:
        self.expected.append((imm, count))
        return Future()

    def cancel(self, imm: int) -> None:
        pass


class FakeEngine(EnginePages):
    def __init__(self, arch):
        self.arch = arch
        self.config = SimpleNamespace(page_size=PAGE_SIZE)
        super().__init__(NUM_PAGES, PAGE_SIZE)  # the page contract, over a real allocator
        self.cache = SimpleNamespace(fmt=SimpleNamespace(num_layers=arch.num_layers, num_pages=NUM_PAGES,
                                                         page_bytes=64))
        self.layer_counter = LayerCounter()
        self.on_step = None
        self.added: list[str] = []

    def add_request(self, request_id, prompt_ids, params):
        self.added.append(request_id)

    def share_cached_prompt(self, request_id, prompt_ids, count=True):
        pages = self.allocator.lookup(page_hashes(list(prompt_ids[:-1]), PAGE_SIZE))
        self.allocator.share(request_id, pages)
        return len(pages)

    def cached_prompt_pages(self, prompt_ids):
        return len(self.allocator.lookup(page_hashes(list(prompt_ids[:-1]), PAGE_SIZE)))

    def add_prefilled_request(self, request_id, prompt_ids, params, num_cached_tokens=0):
        self.added.append((request_id, num_cached_tokens))

    def abort(self, request_id):
        return False


def region(key: int, length_bytes: int) -> bytes:
    return RegionDescriptor(0, key, length_bytes, 0, 0).to_bytes()


@pytest.fixture
def pair():
    plan = make_plan(make_spec(1, 1, model="qwen3-coder-tiny", page_size=PAGE_SIZE, dtype="float32"))
    arch = plan.arch
    slot_bytes = context_bytes(arch.hidden_size, arch.vocab_size)
    page_bytes = plan.route("prefill-0", "decode-0").dst_shape.page_bytes
    decode = UnitInfo("decode-0", "decode-0", "decode", "inc", b"decode-0",
                      [region(1, arch.num_layers * NUM_PAGES * page_bytes)], region(2, SLOTS * slot_bytes),
                      slot_bytes, SLOTS)
    prefill = UnitInfo("prefill-0", "prefill-0", "prefill", "inc", b"prefill-0", [region(3, 1 << 20)],
                       region(4, SLOTS * slot_bytes), slot_bytes, SLOTS)
    d_transfer, p_transfer = RawTransfer(), RawTransfer()
    dm = DecodeMessenger(decode, FakeEngine(arch), d_transfer, plan, memoryview(bytearray(SLOTS * slot_bytes)),
                         SECRET, deadline_s=5.0)
    dm.add_peers([prefill, decode])
    engine = FakeEngine(arch)
    pm = PrefillMessenger(prefill, engine=engine, transfer=p_transfer, plan=plan, pool_regions=[None],
                          staging=ContextStaging(None, memoryview(bytearray(SLOTS * slot_bytes))), secret=SECRET)
    pm.add_peers([prefill, decode])
    yield dm, pm, engine, d_transfer, p_transfer
    pm.close()


def test_a_granted_request_is_admitted_once_and_its_replay_refused(pair):
    dm, pm, engine, d_transfer, _ = pair
    dm.submit("r", list(range(2, 11)), None)
    (peer, captured), = d_transfer.frames
    assert peer == "prefill-0" and isinstance(pr.decode_message(captured, SECRET), pr.PrefillRequest)
    pm.on_frame(captured)
    assert engine.added == ["r"] and pm.busy and pm.frames.total == 0
    pm.on_frame(captured)  # the same bytes again, later: a replay
    assert engine.added == ["r"] and pm.frames.by_reason == {"replayed": 1}


def test_a_bad_request_is_rejected_with_its_typed_reason_and_the_decode_side_told(pair):
    dm, pm, engine, d_transfer, p_transfer = pair
    dm.submit("r", list(range(2, 11)), None)
    request = pr.decode_message(d_transfer.frames[0][1], SECRET)
    too_few = pr.PrefillRequest(**{f: getattr(request, f) for f in request.__struct_fields__}
                                | {"destinations": [pr.DestinationRank(0, request.destinations[0].region, [0])]})
    pm.on_frame(pr.encode_message(too_few, SECRET, "decode-0#inc", 1000))
    assert engine.added == [] and pm.rejected == {"bad_pages": 1}
    (peer, reply), = p_transfer.frames
    answer = pr.decode_frame(reply, SECRET)
    assert peer == "decode-0" and answer.sender == "prefill-0#inc" and answer.seq == 1
    assert isinstance(answer.message, pr.PrefillRejected) and answer.message.reason.startswith("bad_pages: ")


def test_an_abort_of_a_request_it_never_had_is_answered_so_the_pages_can_free(pair):
    dm, pm, _, d_transfer, p_transfer = pair
    dm.submit("r", list(range(2, 11)), None)
    assert dm.abort("r")
    abort = d_transfer.frames[-1][1]
    assert isinstance(pr.decode_message(abort, SECRET), pr.AbortPrefill)
    pm.on_frame(abort)
    answer = pr.decode_message(p_transfer.frames[-1][1], SECRET)
    assert isinstance(answer, pr.PrefillFailed) and "nothing in flight" in answer.reason
    dm.on_frame(p_transfer.frames[-1][1])
    assert dm.frames.total == 0  # the decode side takes the answer as the drain report


def cache_prompt(engine: FakeEngine, prompt: list[int]) -> list[int]:
    """Put ``prompt``'s full pages in the engine's prefix cache, held by nobody; returns the pages."""
    hashes = page_hashes(prompt, PAGE_SIZE)
    grant = engine.allocator.allocate("earlier", len(hashes))
    engine.allocator.cache_pages(list(grant.page_ids), hashes)
    engine.allocator.free("earlier")
    return list(grant.page_ids)


def test_a_decode_prefix_hit_asks_prefill_only_for_the_pages_it_lacks(pair):
    dm, pm, engine, d_transfer, _ = pair
    prompt = list(range(2, 2 + 4 * PAGE_SIZE + 3))  # 3 full pages + a part of prompt[:-1] move without a cache
    cached = cache_prompt(dm.engine, prompt[: 2 * PAGE_SIZE])
    dm.submit("r", prompt, None)
    request = pr.decode_message(d_transfer.frames[0][1], SECRET)
    assert request.num_cached_pages == 2
    granted = request.destinations[0].page_ids
    assert len(granted) == 3 and not set(granted) & set(cached)
    assert dm.engine.allocator.page_ids("r") == cached + granted  # the prompt's pages, in order
    assert d_transfer.expected[-1][1] == expected_writes(
        pm.plan.route("prefill-0", "decode-0"), len(prompt), "HND", num_cached_pages=2).total
    pm.on_frame(d_transfer.frames[0][1])
    assert engine.added == ["r"] and pm._jobs["r"].pages_queued == 2  # the cached pages never move
    forged = pr.PrefillRequest(**{f: getattr(request, f) for f in request.__struct_fields__}
                               | {"request_id": "s", "num_cached_pages": 5})
    pm.on_frame(pr.encode_message(forged, SECRET, "decode-0#inc", 1000))
    assert pm.rejected == {"bad_pages": 1}


def test_a_prompt_cached_whole_on_decode_needs_no_prefill(pair):
    dm, _, _, d_transfer, _ = pair
    prompt = list(range(2, 2 + 2 * PAGE_SIZE + 1))  # prompt[:-1] is exactly two pages
    cache_prompt(dm.engine, prompt)
    dm.submit("r", prompt, None)
    assert d_transfer.frames == [] and dm.engine.added == [("r", 2 * PAGE_SIZE)]
    counters = dm.totals.counters
    assert counters.requests_fully_cached == 1 and counters.pages_not_sent == 2 and counters.bytes_not_sent > 0


def test_a_prompt_to_score_goes_to_prefill_whole_even_when_decode_holds_it(pair):
    from disaggsdk.engine.sampling_params import SamplingParams

    dm, _, _, d_transfer, _ = pair
    prompt = list(range(2, 2 + 2 * PAGE_SIZE + 1))
    cache_prompt(dm.engine, prompt)
    dm.submit("r", prompt, SamplingParams(max_tokens=1, prompt_logprobs=0))
    request = pr.decode_message(d_transfer.frames[0][1], SECRET)
    assert request.num_cached_pages == 0 and len(request.destinations[0].page_ids) == 2
    assert request.prompt_logprobs == 0 and dm.engine.added == []


def test_a_short_suffix_after_a_cached_history_is_prefilled_on_decode(pair):
    """Conditional disaggregation: a prompt with few tokens missing from decode's cache never
    leaves the unit; a longer one, or a prompt to score (a prefill unit scores it whole), goes out."""
    from disaggsdk.engine.sampling_params import SamplingParams

    dm, _, _, d_transfer, _ = pair
    dm.prefill_choice.max_local_prefill_tokens = PAGE_SIZE
    history = list(range(2, 2 + 2 * PAGE_SIZE))
    cache_prompt(dm.engine, history)
    dm.submit("short", history + list(range(100, 100 + PAGE_SIZE + 1)), None)  # PAGE_SIZE tokens to compute
    assert d_transfer.frames == [] and dm.engine.added == ["short"]
    assert dm.totals.counters.requests_prefilled_short == 1 and dm.totals.counters.prefilled_locally == 1
    assert dm.totals.counters.pages_not_sent == 2 and dm.engine.allocator.page_ids("short") == []  # the engine shares them
    dm.submit("long", history + list(range(100, 100 + PAGE_SIZE + 2)), None)  # one token too many
    assert pr.decode_message(d_transfer.frames[-1][1], SECRET).num_cached_pages == 2
    dm.submit("scored", history[:3], SamplingParams(max_tokens=1, prompt_logprobs=0))  # short, yet scored whole
    assert pr.decode_message(d_transfer.frames[-1][1], SECRET).request_id == "scored"
    assert dm.engine.added == ["short"] and dm.totals.counters.requests_prefilled_short == 1


def test_the_prefill_choice_names_no_unit_when_none_is_left(pair):
    """`PrefillChoice.prefill_unit`: every unit down or tried -> None (the caller prefills locally);
    otherwise the one with the fewest outstanding requests (routing "least_loaded" by default)."""
    from disaggsdk.messenger.handoff import Handoff

    dm = pair[0]
    h = Handoff("r", list(range(2, 40)), None, submitted_s=0.0)
    assert dm.prefill_choice.prefill_unit(h, [], {}) is None
    assert dm.prefill_choice.prefill_unit(h, ["a", "b"], {"a": 2, "b": 1}) == "b"
