"""A prefill unit refuses every request that does not match the decode unit's registration."""

from __future__ import annotations

import msgspec
import pytest

from disaggsdk.messenger import protocol as pr
from disaggsdk.messenger.admission import LocalFormat, RejectReason, check_request
from disaggsdk.messenger.peers import UnitInfo

LOCAL = LocalFormat("m", "HND", 4, "float32", 100)
DECODE = UnitInfo("decode-0", "decode-0", "decode", "abc", b"addr", [b"pool0", b"pool1"], b"ctx", 100, 8)


def request(**changes) -> pr.PrefillRequest:
    good = pr.PrefillRequest(
        request_id="r", decode_instance="decode-0#abc", generation=3, imm=9, token_ids=list(range(10)), model="m",
        layout="HND", page_size=4, kv_dtype="float32", decode_tp=2,
        destinations=[pr.DestinationRank(0, b"pool0", [1, 2, 3]), pr.DestinationRank(1, b"pool1", [1, 2, 3])],
        context=pr.ContextSlot(b"ctx", 200, 100),
    )
    return msgspec.structs.replace(good, **changes)


def test_a_matching_request_passes():
    assert check_request(request(), DECODE, 16, LOCAL) is None


@pytest.mark.parametrize("changes,reason", [
    ({"model": "other"}, "mismatch"),
    ({"page_size": 8}, "mismatch"),
    ({"decode_tp": 1}, "mismatch"),
    ({"destinations": [pr.DestinationRank(0, b"pool0", [1, 2, 3])]}, "mismatch"),
    ({"imm": 0}, "bad_request"),
    ({"imm": 1 << 32}, "bad_request"),
    ({"token_ids": [5]}, "bad_request"),
    ({"destinations": [pr.DestinationRank(0, b"pool1", [1, 2, 3]), pr.DestinationRank(1, b"pool1", [1, 2, 3])]},
     "bad_region"),
    ({"destinations": [pr.DestinationRank(0, b"pool0", [1, 2, 99]), pr.DestinationRank(1, b"pool1", [1, 2, 99])]},
     "bad_pages"),
    ({"destinations": [pr.DestinationRank(0, b"pool0", [1, 2, -1]), pr.DestinationRank(1, b"pool1", [1, 2, -1])]},
     "bad_pages"),
    ({"destinations": [pr.DestinationRank(0, b"pool0", [1, 1, 2]), pr.DestinationRank(1, b"pool1", [1, 1, 2])]},
     "bad_pages"),
    ({"destinations": [pr.DestinationRank(0, b"pool0", [1, 2]), pr.DestinationRank(1, b"pool1", [1, 2])]},
     "bad_pages"),
    ({"destinations": [pr.DestinationRank(0, b"pool0", [1, 2, 3]), pr.DestinationRank(1, b"pool1", [4, 5, 6])]},
     "bad_pages"),
    ({"context": None}, "bad_context"),
    ({"context": pr.ContextSlot(b"pool0", 200, 100)}, "bad_context"),
    ({"context": pr.ContextSlot(b"ctx", 200, 64)}, "bad_context"),
    ({"context": pr.ContextSlot(b"ctx", 800, 100)}, "bad_context"),
    ({"context": pr.ContextSlot(b"ctx", 150, 100)}, "bad_context"),
])
def test_each_mismatch_is_named(changes, reason):
    problem = check_request(request(**changes), DECODE, 16, LOCAL)
    assert problem is not None and problem.reason.value == reason, problem
    assert str(problem).startswith(f"{reason}: ") and problem.detail  # the wire form names it too


def test_an_unknown_sender_is_not_a_peer():
    assert check_request(request(), None, 0, LOCAL).reason is RejectReason.UNKNOWN_PEER


def test_a_peer_id_reads_back_what_it_wrote():
    from disaggsdk.messenger.peers import PeerId

    peer = PeerId("decode-0.dp1", "a1b2c3")
    assert str(peer) == "decode-0.dp1#a1b2c3" and PeerId.parse(str(peer)) == peer
    assert PeerId.parse("decode-0") == PeerId("decode-0", "")  # no incarnation: matches no live peer
    assert DECODE.peer_id == PeerId(DECODE.name, DECODE.incarnation)


def test_an_fp8_prefill_refuses_a_bfloat16_decode_and_the_reverse():
    """The pages are raw bytes: an fp8 page read as bfloat16 (or the reverse) would be garbage of
    the wrong length, so a KV dtype mismatch is refused before any byte moves, naming both sides."""
    fp8_local = LocalFormat("m", "HND", 4, "fp8", 100)
    problem = check_request(request(kv_dtype="bfloat16"), DECODE, 16, fp8_local)
    assert problem is not None and problem.reason is RejectReason.MISMATCH
    assert "'fp8'" in problem.detail and "'bfloat16'" in problem.detail
    bf16_local = LocalFormat("m", "HND", 4, "bfloat16", 100)
    assert check_request(request(kv_dtype="fp8"), DECODE, 16, bf16_local).reason is RejectReason.MISMATCH
    assert check_request(request(kv_dtype="fp8"), DECODE, 16, fp8_local) is None
