"""A running deployment under stress and faults (real processes over tcp, tiny Qwen3-MoE).

One runtime with two prefill units and one decode unit serves, in order: 100 requests (every
page returns on both sides), forged and malformed control frames (counted, nothing lands),
layer-streamed writes, a hung prefill (deadline, retry, quarantine freed after its drain
report), a killed prefill mid-transfer (retry elsewhere, no leak), local prefill once no
prefill is left, a crashed decode (reported with its log tail), and a clean close.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("torch")

from disaggsdk.engine.config import EngineConfig
from disaggsdk.engine.llm_engine import LLMEngine
from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.messenger import protocol as pr
from disaggsdk.serve.backends.local import serve_locally
from tests.launch._helpers import live_descendants, make_spec

MODEL = "qwen3-coder-tiny"
SECRET = b"lifecycle-test-secret-0123456789"
DEADLINE_S = 3.0
PROVIDER = "tcp"
GREEDY = SamplingParams(max_tokens=3, ignore_eos=True)


def prompt(i: int, n: int) -> list[int]:
    return [(i * 31 + j * 7) % 250 + 2 for j in range(n)]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    before = live_descendants()
    shm_before = set(os.listdir("/dev/shm"))
    # tcp, not shm: libfabric's shm provider locks each receiver's queue with a spinlock in shared
    # memory, and a unit SIGKILLed while holding one wedges its peers for good (an open issue);
    # these tests kill units under load on purpose
    spec = make_spec(MODEL, prefill_replicas=2, deadline_s=DEADLINE_S, num_pages=96, budget=64, provider=PROVIDER)
    # max_restarts=0: these tests follow a deployment whose dead units stay dead (test_restart.py: the others)
    rt = serve_locally(spec, secret=SECRET, on_event=lambda _line: None, max_restarts=0,
                       log_dir=str(tmp_path_factory.mktemp("logs")))
    reference = LLMEngine(MODEL, EngineConfig(page_size=4, num_pages=512))
    try:
        yield rt, reference
    finally:
        rt.close()
        reference.close()
        assert live_descendants() <= before, "a unit or tp worker outlived close()"
        # other suites may create shm files meanwhile: look at those named after our units' pids
        pids = {str(u.process.pid) for u in rt.runtime.units.values()}
        left = {n for n in set(os.listdir("/dev/shm")) - shm_before if n.split(":")[0] in pids}
        assert not left, f"shared memory left behind: {left}"


def tokens(events) -> list[int]:
    return [t for e in events for t in e.new_token_ids]


def expect(reference, prompts, params=GREEDY) -> list[list[int]]:
    return [o.output_ids for o in reference.generate(prompts, params)]


def wait_all_free(rt, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = rt.unit_stats()
        if all(s.num_free_pages == s.num_pages for s in stats.values()) or time.monotonic() > deadline:
            return stats
        time.sleep(0.2)


def test_hundred_requests_return_every_page(env):
    rt, reference = env
    start = rt.unit_stats()
    cpu_before_s = rt.runtime.unit_cpu_s()
    prompts = [prompt(i, 1 + (i * 13) % 40) for i in range(100)]
    events = rt.generate_batch(prompts, GREEDY, timeout_s=240)
    cpu_after_s = rt.runtime.unit_cpu_s()
    assert set(cpu_after_s) == set(rt.runtime.units)
    assert all(cpu_after_s[n] > cpu_before_s[n] for n in ("prefill-0", "decode-0"))  # both worked
    assert [tokens(ev) for ev in events] == expect(reference, prompts)
    stats = wait_all_free(rt)
    assert {n: s.num_free_pages for n, s in stats.items()} == {n: s.num_free_pages for n, s in start.items()}
    assert {n: s.num_free_pages for n, s in stats.items()} == {n: s.num_pages for n, s in stats.items()}
    assert sum(s.counters.transfer_writes for s in stats.values() if s.role == "prefill") > 0
    assert stats["decode-0"].counters.transfer_failures == 0


def test_streamed_writes_start_during_the_forward_pass(env):
    rt, _ = env
    # one 40-token chunk: 10 pages, within one step. prompt(150, .) shares no page with another
    # prompt of this module (prompt(7, 41) did: the 100-request test's prompt(7, 12) left 3 of its
    # pages in the decode unit's prefix cache, unless 100 requests had evicted them first)
    rt.generate_batch([prompt(150, 41)], GREEDY)
    records = [r for s in rt.unit_stats().values() if s.role == "prefill" for r in s.recent if r.num_tokens == 41]
    assert records and records[-1].lead_s > 0, records  # first write went before the forward ended
    # the last layer's writes went out once its KV was complete: after the forward began, before
    # the decode unit's counter fired (one machine's clock)
    fired = [r.fired_s for s in rt.unit_stats().values() if s.role == "decode" for r in s.recent
             if r.request_id == records[-1].request_id]
    assert records[-1].forward_start_s < records[-1].last_layer_s < fired[0], (records[-1], fired)
    assert records[-1].writes == 10 * 4 + 1  # pages x layers + context (identical sharding, HND)


def test_bad_frames_are_counted_and_land_nothing(env):
    from disaggsdk.transfer import TransferEngine

    rt, reference = env
    prefill, decode = rt.runtime.units["prefill-0"].info, rt.runtime.units["decode-0"].info
    before = rt.unit_stats()
    good = pr.PrefillRequest(
        request_id="forged", decode_instance=str(decode.peer_id), generation=1, imm=77,
        token_ids=prompt(1, 9), model=rt.spec.model, layout="HND", page_size=4, kv_dtype="float32", decode_tp=1,
        destinations=[pr.DestinationRank(0, decode.pool_regions[0], [0, 10**6])],
        context=pr.ContextSlot(decode.context_region, 0, decode.context_slot_bytes),
    )
    # forged as decode-0 with the secret, numbered far above what decode-0 itself will reach here
    sender, seqs = str(decode.peer_id), iter(range(3000, 3100))
    frame = pr.encode_message(good, SECRET, sender, next(seqs))
    signed = bytearray(frame[:-pr.MAC_BYTES])
    signed[4] = pr.PROTOCOL_VERSION + 1
    import hashlib
    import hmac

    future_version = bytes(signed) + hmac.new(SECRET, bytes(signed), hashlib.sha256).digest()
    abort = pr.AbortPrefill("nobody", 3, sender)
    with TransferEngine(PROVIDER) as te:
        to_prefill, to_decode = te.add_peer(prefill.address), te.add_peer(decode.address)
        for f in (b"junk", pr.encode_message(good, b"x" * 32, sender, next(seqs)), future_version, frame, frame,
                  pr.encode_message(abort, SECRET, sender, next(seqs)), pr.encode_message(pr.AbortPrefill("x", 3), SECRET),
                  pr.encode_message(abort, SECRET, "prefill-1#x", next(seqs))):
            te.send(to_prefill, f).result(timeout=10)
        te.send(to_decode, pr.encode_message(pr.PrefillFailed("nobody", 1, "x"), b"y" * 32)).result(timeout=10)
        time.sleep(0.5)
    after = rt.unit_stats()
    p = after["prefill-0"]
    assert p.counters.rejected_frames == {"MalformedFrame": 1, "BadMac": 1, "UnknownVersion": 1, "replayed": 1,
                                 "unsequenced": 1, "sender_mismatch": 1}
    assert p.counters.rejected_requests == {"bad_pages": 1}
    assert after["decode-0"].counters.rejected_frames.get("BadMac") == 1
    # the PrefillRejected sent for "forged" and the "nothing in flight" answer to the abort of "nobody"
    assert after["decode-0"].counters.rejected_frames.get("stale") == 2
    assert p.counters.transfer_writes == before["prefill-0"].counters.transfer_writes  # nothing was written
    assert tokens(rt.generate_batch([prompt(2, 9)], GREEDY)[0]) == expect(reference, [prompt(2, 9)])[0]


def test_async_stream_and_abort_in_handoff_and_in_decode(env):
    import asyncio

    rt, reference = env
    long_prompt = prompt(90, 150)

    async def scenario():
        # abort while the KV is still on its way (prefill units frozen): the decode side
        # quarantines the pages until the woken prefill has drained and said so
        frozen = [rt.runtime.units[n].process.pid for n in ("prefill-0", "prefill-1")]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            handoff = rt.generate("abort-early", long_prompt, SamplingParams(max_tokens=50, ignore_eos=True))
            task = asyncio.ensure_future(handoff.__anext__())
            await asyncio.sleep(0.2)
            await rt.abort("abort-early")
            early = await task
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        # abort mid-decode: tokens streamed so far are the greedy ones
        stream = rt.generate("abort-late", prompt(91, 9), SamplingParams(max_tokens=300, ignore_eos=True))
        first = await stream.__anext__()
        await rt.abort("abort-late")
        rest = [ev async for ev in stream]
        return early, first, rest

    early, first, rest = asyncio.run(scenario())
    assert early.finished and early.finish_reason == "abort" and not early.new_token_ids
    assert first.new_token_ids == expect(reference, [prompt(91, 9)], SamplingParams(max_tokens=1))[0]
    assert rest[-1].finish_reason == "abort" and len(rest) < 299
    stats = wait_all_free(rt)
    assert all(s.num_free_pages == s.num_pages for s in stats.values())


def test_hung_prefill_hits_the_deadline_and_retries(env):
    rt, reference = env
    stopped = rt.runtime.units["prefill-0"].process.pid
    os.kill(stopped, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        prompts = [prompt(40 + i, 20) for i in range(2)]
        events = rt.generate_batch(prompts, GREEDY, timeout_s=60)
        elapsed = time.monotonic() - t0
    finally:
        os.kill(stopped, signal.SIGCONT)
    assert [tokens(ev) for ev in events] == expect(reference, prompts)
    assert elapsed < DEADLINE_S + 15
    stats = wait_all_free(rt)  # the woken prefill drains, reports, and the quarantine frees
    assert stats["decode-0"].counters.requests_retried >= 1
    assert all(s.num_free_pages == s.num_pages for s in stats.values())


def test_killed_prefill_mid_transfer_costs_a_retry_not_a_hang(env):
    rt, reference = env
    prompts = [prompt(60 + i, 150) for i in range(4)]  # 150 tokens over a 64-token budget: 3 chunks each
    done = {}
    t0 = time.monotonic()
    for i, p in enumerate(prompts):
        rt.submit(f"kill-{i}", p, GREEDY, lambda ev, i=i: done.setdefault(i, []).append(ev))
    while rt.unit_stats()["prefill-1"].running == 0:
        assert time.monotonic() - t0 < 30, "prefill-1 never started"
        time.sleep(0.01)
    rt.runtime.kill_unit("prefill-1")
    while sum(1 for evs in done.values() if evs[-1].finished) < len(prompts):
        assert time.monotonic() - t0 < DEADLINE_S + 30, "requests hung after a prefill died"
        time.sleep(0.05)
    assert [tokens(done[i]) for i in range(len(prompts))] == expect(reference, prompts)
    assert any("prefill-1" in f and "last lines" in f for f in rt.runtime.failures)
    stats = wait_all_free(rt)
    assert all(s.num_free_pages == s.num_pages for s in stats.values())


def test_local_prefill_when_no_prefill_is_left(env):
    rt, reference = env
    rt.runtime.kill_unit("prefill-0")
    while rt.runtime.units["prefill-0"].healthy:
        time.sleep(0.05)
    prompts = [prompt(80, 23), prompt(81, 5)]
    events = rt.generate_batch(prompts, GREEDY, timeout_s=60)
    assert [tokens(ev) for ev in events] == expect(reference, prompts)
    stats = wait_all_free(rt)
    assert stats["decode-0"].counters.prefilled_locally >= 2
    assert stats["decode-0"].num_free_pages == stats["decode-0"].num_pages


def test_crashed_decode_is_reported_and_refused(env):
    rt, _ = env
    rt.runtime.kill_unit("decode-0")
    deadline = time.monotonic() + 30
    # the unit reads as unhealthy first (nothing is routed to it), its report follows its exit
    while not any(f.startswith("unit decode-0 (decode) died") for f in rt.runtime.failures):
        assert time.monotonic() < deadline, "no report of decode-0's death"
        time.sleep(0.05)
    assert not rt.runtime.units["decode-0"].healthy
    assert any(f.startswith("unit decode-0 (decode) died") and "last lines" in f for f in rt.runtime.failures)
    from disaggsdk.launch import LaunchError

    with pytest.raises(LaunchError, match="no decode unit is healthy"):
        rt.submit("after-crash", prompt(1, 3), GREEDY, lambda ev: None)
