"""Forged RMA writes over tcp (issue 33): an attacker process that holds the decode units' fabric
addresses and the keys the address book hands every unit writes garbage over each decode unit's
whole KV pool and context buffer, as the hostile probe of 2026-12-05 did with a captured key.
With per-grant keys (tcp's default) nothing lands: the pools are open only to a live transfer's own
keys, and the prompt served again from the prefix cache gives the same tokens. The control case
(`grant_keys: off`, the whole pool under one key) shows the same writes do land: what the probe saw."""

from __future__ import annotations

import multiprocessing
import struct

import attrs
import pytest

torch = pytest.importorskip("torch")

from disaggsdk.engine.sampling_params import SamplingParams  # noqa: E402
from disaggsdk.serve.backends.local import serve_locally  # noqa: E402
from tests.launch._helpers import live_descendants, make_spec  # noqa: E402

MODEL = "qwen3-coder-tiny"
PARAMS = SamplingParams(max_tokens=8, ignore_eos=True)
PROMPT = [(7 * i + 3) % 250 for i in range(41)]  # 40 tokens move: 10 pages of 4
CHUNK_BYTES = 64 << 10
FORGED_IMM = 0xBAD


def attack(address: bytes, descriptors: list[bytes], conn) -> None:
    """The attacker's process: writes 1e30 floats over every byte of every region it was given."""
    from disaggsdk.transfer import RegionDescriptor, TransferEngine, WriteBatch

    results = []
    with TransferEngine("tcp") as engine:
        garbage = bytearray(struct.pack("<f", 1e30) * (CHUNK_BYTES // 4))
        src = engine.register(garbage, remote_write=False)
        peer = engine.add_peer(address)
        for raw in descriptors:
            dst = RegionDescriptor.from_bytes(raw)
            offsets = list(range(0, dst.length_bytes - CHUNK_BYTES + 1, CHUNK_BYTES))
            tail = dst.length_bytes - (offsets[-1] + CHUNK_BYTES if offsets else 0)
            try:
                if offsets:
                    engine.submit(peer, WriteBatch.of(src, dst, [0] * len(offsets), offsets, CHUNK_BYTES,
                                                      FORGED_IMM)).result(timeout=30)
                if tail:
                    engine.submit(peer, WriteBatch.of(src, dst, [0], [dst.length_bytes - tail], tail,
                                                      FORGED_IMM)).result(timeout=30)
                results.append("sent")
            except Exception as exc:  # noqa: BLE001 - refused on our side is as good as refused there
                results.append(f"refused: {exc}")
        engine.deregister(src)
    conn.send(results)


def forge(units) -> list[str]:
    """Run the attacker against every decode unit; returns what its writes came to."""
    ctx = multiprocessing.get_context("spawn")
    out = []
    for info in units:
        ours, theirs = ctx.Pipe()
        process = ctx.Process(target=attack, args=(info.address, [*info.pool_regions, info.context_region], theirs))
        process.start()
        try:
            assert ours.poll(60), "the attacker did not finish"
            out += ours.recv()
        finally:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
    return out


@pytest.mark.parametrize("grant_keys", ["auto", "off"])
def test_forged_writes_with_the_address_books_keys_land_nowhere(grant_keys):
    spec = make_spec(MODEL, provider="tcp")
    spec = attrs.evolve(spec, transport=attrs.evolve(spec.transport, grant_keys=grant_keys))
    before = live_descendants()
    with serve_locally(spec, on_event=lambda _line: None) as rt:
        def tokens() -> tuple[list[int], int]:
            events = rt.generate_batch([PROMPT], PARAMS, timeout_s=60)[0]
            assert events[-1].finish_reason == "length", events[-1].error
            return [t for e in events for t in e.new_token_ids], events[-1].num_cached_tokens

        first, _ = tokens()
        decodes = [u.info for u in rt.runtime.units.values() if u.args.role == "decode"]
        outcome = forge(decodes)
        again, cached = tokens()
        stats = rt.unit_stats()
    assert live_descendants() <= before
    assert cached > 0  # the second answer came from the decode unit's prefix cache: the pages attacked
    assert outcome  # the attacker reached every unit (tcp reports no refusal: the target drops the writes)
    if grant_keys == "auto":
        assert again == first
        assert not any(s.counters.transfer_failures for s in stats.values())
    else:
        assert again != first, "with the whole pool under one key the forged writes land (the probe's finding)"
