"""Control messages between messengers: versioned binary frames, size-bounded, HMAC-authenticated.

Never pickle (LESSONS.md: unpickling peer data gave remote code execution in three systems).
A frame is::

    magic b"DSGK" | version u8 | kind u8 | reserved u16 | body_len u32 | body | mac[32]

``body`` is msgpack of a typed `msgspec.Struct` (decoding checks every field's type), ``mac`` is
HMAC-SHA256 under the per-deployment secret over header and body. Anything that fails a check
raises a `ProtocolError` subclass: the receiver counts it and drops the frame.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import ClassVar

import msgspec

from disaggsdk.errors import DisaggError

MAGIC = b"DSGK"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<4sBBHI")
MAC_BYTES = 32
MAX_BODY_BYTES = 4 << 20  # a 128K-token prompt with its page lists fits with room to spare
MIN_SECRET_BYTES = 16


class ProtocolError(DisaggError):
    """A control frame was rejected. Subclasses say why; none of them ever lands a write."""


class BadMac(ProtocolError):
    """The frame's HMAC does not match: wrong deployment secret, or tampered bytes."""


class UnknownVersion(ProtocolError):
    """The frame comes from a peer speaking another protocol version."""


class FrameTooLarge(ProtocolError):
    """The frame is larger than `MAX_BODY_BYTES` allows."""


class MalformedFrame(ProtocolError):
    """Truncated frame, bad magic, unknown kind, or a body whose fields have the wrong types."""


# messages


class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Base of every control message; ``KIND`` is its one-byte type id on the wire."""

    KIND: ClassVar[int] = 0


class DestinationRank(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where one decode rank wants a request's KV: its pool's descriptor and the granted pages."""

    tp_rank: int
    region: bytes  # serialized transfer-engine descriptor of the rank's KV pool
    page_ids: list[int]  # in prompt order; page i holds tokens [i*page_size, (i+1)*page_size)


class ContextSlot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the hidden state and logits of the last prefilled position go."""

    region: bytes  # serialized descriptor of the decode head rank's context buffer
    offset_bytes: int
    length_bytes: int


class PrefillRequest(Message, frozen=True):
    """Decode -> prefill: prefill ``token_ids`` and write the KV into these granted pages.

    Every write carries ``imm``; the decode side counts them against the planner's prediction.
    The sharding fields let prefill refuse a mismatched deployment before any byte moves.
    """

    KIND: ClassVar[int] = 1
    request_id: str
    decode_instance: str  # instance name + incarnation id: a restarted decode is a new peer
    generation: int  # grant generation of every page listed below
    imm: int  # 32-bit immediate data carried by every write of this request
    token_ids: list[int]  # the whole prompt; prefill computes KV of token_ids[:-1], decode runs the last
    model: str
    layout: str
    page_size: int
    kv_dtype: str
    decode_tp: int
    destinations: list[DestinationRank]
    context: ContextSlot | None = None


class PrefillRejected(Message, frozen=True):
    """Prefill -> decode: the request cannot be served here (mismatch, overload, bad grant)."""

    KIND: ClassVar[int] = 2
    request_id: str
    generation: int
    reason: str


class PrefillFailed(Message, frozen=True):
    """Prefill -> decode: the request was accepted but its transfer failed; decode retries."""

    KIND: ClassVar[int] = 3
    request_id: str
    generation: int
    reason: str


class AbortPrefill(Message, frozen=True):
    """Decode -> prefill: stop work on a request (client cancelled, deadline passed).

    Prefill answers with `PrefillFailed` once nothing of that attempt is in flight any more
    (also when it never had the request): only then may decode free the pages.
    """

    KIND: ClassVar[int] = 4
    request_id: str
    generation: int
    decode_instance: str = ""  # who to answer (as in PrefillRequest)


class Hello(Message, frozen=True):
    """First message on a connection: who the peer is and how its KV is laid out."""

    KIND: ClassVar[int] = 5
    instance: str  # name + incarnation id
    role: str  # "prefill" | "decode"
    model: str
    tp: int
    dp: int
    layout: str
    page_size: int
    kv_dtype: str
    addresses: list[bytes]  # transfer-engine endpoint address of each rank, in rank order


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.KIND: cls for cls in (PrefillRequest, PrefillRejected, PrefillFailed, AbortPrefill, Hello)
}
_DECODERS = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in MESSAGE_TYPES.items()}
_ENCODER = msgspec.msgpack.Encoder()


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the deployment secret must be at least {MIN_SECRET_BYTES} bytes")


def encode_message(message: Message, secret: bytes) -> bytes:
    """One authenticated frame carrying ``message``.

    Raises:
        FrameTooLarge: the encoded body exceeds `MAX_BODY_BYTES`.
    """
    _check_secret(secret)
    body = _ENCODER.encode(message)
    if len(body) > MAX_BODY_BYTES:
        raise FrameTooLarge(f"{type(message).__name__} body is {len(body)} bytes, limit {MAX_BODY_BYTES}")
    header = HEADER.pack(MAGIC, PROTOCOL_VERSION, message.KIND, 0, len(body))
    mac = hmac.new(secret, header + body, hashlib.sha256).digest()
    return header + body + mac


def decode_message(frame: bytes, secret: bytes) -> Message:
    """The message in an authenticated frame.

    The MAC is checked before the body is parsed, so unauthenticated bytes never reach the decoder.

    Raises:
        MalformedFrame, FrameTooLarge, UnknownVersion, BadMac: the frame is rejected.
    """
    _check_secret(secret)
    frame = bytes(frame)
    if len(frame) < HEADER.size + MAC_BYTES:
        raise MalformedFrame(f"frame of {len(frame)} bytes is shorter than header and MAC")
    magic, version, kind, _reserved, body_len = HEADER.unpack_from(frame)
    if magic != MAGIC:
        raise MalformedFrame(f"bad magic {magic!r}: not a disaggsdk control frame")
    if body_len > MAX_BODY_BYTES:
        raise FrameTooLarge(f"declared body of {body_len} bytes exceeds {MAX_BODY_BYTES}")
    if len(frame) != HEADER.size + body_len + MAC_BYTES:
        raise MalformedFrame(f"frame is {len(frame)} bytes, header says {HEADER.size + body_len + MAC_BYTES}")
    signed, mac = frame[: HEADER.size + body_len], frame[HEADER.size + body_len :]
    if not hmac.compare_digest(mac, hmac.new(secret, signed, hashlib.sha256).digest()):
        raise BadMac("control frame failed authentication (wrong deployment secret or altered bytes)")
    if version != PROTOCOL_VERSION:
        raise UnknownVersion(f"protocol version {version}, this side speaks {PROTOCOL_VERSION}")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise MalformedFrame(f"unknown message kind {kind}")
    try:
        return decoder.decode(signed[HEADER.size :])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedFrame(f"{MESSAGE_TYPES[kind].__name__}: {exc}") from None
