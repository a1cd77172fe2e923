"""Control frames: round trip, and every kind of bad frame is rejected with its own error."""

import hashlib
import hmac

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disaggsdk.messenger.protocol import (
    HEADER,
    MAX_BODY_BYTES,
    PROTOCOL_VERSION,
    AbortPrefill,
    BadMac,
    ContextSlot,
    DestinationRank,
    FrameTooLarge,
    Hello,
    MalformedFrame,
    PrefillRejected,
    PrefillRequest,
    UnknownVersion,
    decode_frame,
    decode_message,
    encode_message,
)

SECRET = b"s" * 32


def request(**over) -> PrefillRequest:
    fields = dict(
        request_id="r1", decode_instance="decode-0/abc", generation=3, imm=7, token_ids=[1, 2, 3],
        model="qwen3-coder-tiny", layout="HND", page_size=16, kv_dtype="float32", decode_tp=2,
        destinations=[DestinationRank(0, b"desc0", [4, 9]), DestinationRank(1, b"desc1", [4, 9])],
        context=ContextSlot(b"ctx", 1024, 2048),
    )
    return PrefillRequest(**{**fields, **over})


def resign(signed: bytes) -> bytes:
    return signed + hmac.new(SECRET, signed, hashlib.sha256).digest()


@pytest.mark.parametrize("message", [
    request(), PrefillRejected("r1", 3, "layout mismatch"), AbortPrefill("r1", 3),
    Hello("prefill-0/xyz", "prefill", "m", 2, 1, "HND", 16, "float32", [b"a", b"b"]),
])
def test_round_trip(message):
    assert decode_message(encode_message(message, SECRET), SECRET) == message


@given(st.lists(st.integers(0, 2**31 - 1), max_size=200), st.integers(0, 2**32 - 1))
def test_round_trip_random_requests(tokens, imm):
    msg = request(token_ids=tokens, imm=imm)
    assert decode_message(encode_message(msg, SECRET), SECRET) == msg


def test_wrong_secret_and_any_flipped_byte_fail_authentication():
    frame = encode_message(request(), SECRET)
    with pytest.raises(BadMac):
        decode_message(frame, b"t" * 32)
    for i in range(HEADER.size, len(frame)):  # header flips are caught earlier or by the MAC too
        tampered = bytearray(frame)
        tampered[i] ^= 0x01
        with pytest.raises((BadMac, MalformedFrame)):
            decode_message(bytes(tampered), SECRET)


def test_unknown_version_is_rejected_even_when_signed():
    frame = encode_message(AbortPrefill("r", 1), SECRET)
    body = frame[HEADER.size:-32]
    header = HEADER.pack(b"DSGK", 99, 4, 0, len(body), 0)
    with pytest.raises(UnknownVersion):
        decode_message(resign(header + body), SECRET)


def test_truncated_bad_magic_and_oversized_frames():
    frame = encode_message(AbortPrefill("r", 1), SECRET)
    with pytest.raises(MalformedFrame, match="shorter"):
        decode_message(frame[:10], SECRET)
    with pytest.raises(MalformedFrame, match="header says"):
        decode_message(frame[:-1], SECRET)
    with pytest.raises(MalformedFrame, match="bad magic"):
        decode_message(b"XXXX" + frame[4:], SECRET)
    huge = HEADER.pack(b"DSGK", PROTOCOL_VERSION, 4, 0, MAX_BODY_BYTES + 1, 0) + b"\0" * 32
    with pytest.raises(FrameTooLarge):
        decode_message(huge, SECRET)
    with pytest.raises(FrameTooLarge):
        encode_message(request(token_ids=list(range(1_000_000))), SECRET)


def test_signed_body_with_wrong_field_types_is_malformed():
    import msgspec

    body = msgspec.msgpack.encode({"request_id": 5, "generation": "x"})
    header = HEADER.pack(b"DSGK", PROTOCOL_VERSION, AbortPrefill.KIND, 0, len(body), 0)
    with pytest.raises(MalformedFrame, match="AbortPrefill"):
        decode_message(resign(header + body), SECRET)
    header = HEADER.pack(b"DSGK", PROTOCOL_VERSION, 200, 0, len(body), 0)
    with pytest.raises(MalformedFrame, match="unknown message kind 200"):
        decode_message(resign(header + body), SECRET)


def test_short_secrets_are_refused():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        encode_message(AbortPrefill("r", 1), b"short")


def test_sender_and_sequence_travel_inside_the_mac():
    frame = encode_message(AbortPrefill("r", 1, "decode-0#abc"), SECRET, sender="decode-0#abc", seq=41)
    got = decode_frame(frame, SECRET)
    assert (got.sender, got.seq, got.message) == ("decode-0#abc", 41, AbortPrefill("r", 1, "decode-0#abc"))
    # rewriting the sequence number (to replay a frame as a new one) breaks the MAC
    forged = bytearray(frame)
    forged[HEADER.size - 8:HEADER.size] = (42).to_bytes(8, "little")
    with pytest.raises(BadMac):
        decode_frame(bytes(forged), SECRET)
