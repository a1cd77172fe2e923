"""Control messages between messengers: versioned binary frames, size-bounded, HMAC-authenticated.

Never pickled: unpickling peer data is remote code execution.
A frame is::

    magic b"DSGK" | version u8 | kind u8 | sender_len u16 | body_len u32 | seq u64 | sender | body | mac[32]
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from typing import ClassVar

import msgspec

from disaggsdk.engine.request_migration import RunningRequestState
from disaggsdk.errors import DisaggError

MAGIC = b"DSGK"
# 2: sender and sequence number inside the MAC; 3: grant segments, digests;
# 4: PrefillRequest.traced (bodies forbid unknown fields: an older peer would refuse every request)
# 5: KV migration between decode units (MigrateOffer, MigrateAccept, MigrateRefused, MigrateAdmitted, MigrateCancel)
PROTOCOL_VERSION = 5
HEADER = struct.Struct("<4sBBHIQ")
MAX_SENDER_BYTES = 255
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


class GrantSegment(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One run of granted bytes, registered under a key of its own for one attempt (`grant_keys`)."""

    offset_bytes: int  # where the run starts in the rank's pool (or context buffer)
    length_bytes: int
    key: int  # the run's registration key, revoked when the attempt ends
    check: int  # the target library's check of the run's descriptor


class DestinationRank(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where one decode rank wants a request's KV: its pool's descriptor and the granted pages."""

    tp_rank: int
    region: bytes  # serialized transfer-engine descriptor of the rank's KV pool
    page_ids: list[int]  # in prompt order; page i holds tokens [i*page_size, (i+1)*page_size)
    # with per-grant keys, the only bytes of the pool open to this attempt's writes (empty: the
    # whole pool is open under ``region``'s key, as on shm)
    segments: list[GrantSegment] = []


class ContextSlot(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the hidden state and logits of the last prefilled position go."""

    region: bytes  # serialized descriptor of the decode head rank's context buffer
    offset_bytes: int
    length_bytes: int
    segment: GrantSegment | None = None  # with per-grant keys: the slot's own registration


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
    prompt_logprobs: int | None = None  # score the prompt too, with this many alternatives per token
    # the prompt's first pages decode holds already (its prefix cache): prefill writes none of them,
    # and ``destinations`` list only the pages after them
    num_cached_pages: int = 0
    # the router traces the request: the prefill unit records its phases (`messenger.span_log`)
    traced: bool = False


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


class PageDigest(Message, frozen=True):
    """Prefill -> decode, with ``$.transport.verify_pages``: the keyed digest of every byte this attempt
    wrote (`messenger.page_digest`), sent once all its writes completed locally. Decode admits the
    request only when the pages it holds give the same digest."""

    KIND: ClassVar[int] = 6
    request_id: str
    generation: int
    digest: bytes


# moving a decoding request between decode units (`messenger.kv_migration`); ``migration`` numbers
# one attempt on the source unit, as ``generation`` numbers a grant


class MigrateOffer(Message, frozen=True):
    """Source decode unit -> target decode unit: take over this decoding request; grant pages for its
    ``state.num_computed_tokens`` tokens and answer `MigrateAccept` (or `MigrateRefused`). The KV
    shape fields let the target refuse pages it could not read before any byte moves."""

    KIND: ClassVar[int] = 7
    request_id: str
    migration: int
    source: str  # the source unit's PeerId, who to answer
    state: RunningRequestState
    model: str
    layout: str
    page_size: int
    kv_dtype: str
    tp: int
    num_layers: int  # cache layers of one rank's pool (the MTP layer's included)
    page_bytes: int  # one page of one layer on one rank
    traced: bool = False


class MigrateAccept(Message, frozen=True):
    """Target -> source: write the request's pages into these, every write carrying ``imm``."""

    KIND: ClassVar[int] = 8
    request_id: str
    migration: int
    imm: int
    destinations: list[DestinationRank]


class MigrateRefused(Message, frozen=True):
    """Target -> source: the target will not continue the request (mismatch, no pages, deadline,
    aborted, its state did not load); the source resumes it, once its writes (if any) drained."""

    KIND: ClassVar[int] = 9
    request_id: str
    migration: int
    reason: str


class MigrateAdmitted(Message, frozen=True):
    """Target -> source: every write landed and the request decodes here now; the source frees its pages."""

    KIND: ClassVar[int] = 10
    request_id: str
    migration: int


class MigrateCancel(Message, frozen=True):
    """Source -> target: the migration is off (aborted, refused, late); no write of it is in flight
    any more, so the target may free the pages it granted."""

    KIND: ClassVar[int] = 11
    request_id: str
    migration: int
    reason: str


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.KIND: cls for cls in (PrefillRequest, PrefillRejected, PrefillFailed, AbortPrefill, Hello, PageDigest,
                              MigrateOffer, MigrateAccept, MigrateRefused, MigrateAdmitted, MigrateCancel)
}
_DECODERS = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in MESSAGE_TYPES.items()}
_ENCODER = msgspec.msgpack.Encoder()


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the deployment secret must be at least {MIN_SECRET_BYTES} bytes")


@dataclass(frozen=True)
class Frame:
    """An authenticated frame: who sent it, its place in the sender's sequence, and the message."""

    sender: str  # the sending unit's PeerId as text ("" in frames of no unit: tests, tools)
    seq: int  # 1, 2, ... per sender; 0: unsequenced
    message: Message


def encode_message(message: Message, secret: bytes, sender: str = "", seq: int = 0) -> bytes:
    """One authenticated frame carrying ``message`` from ``sender`` as its ``seq``-th frame.

    Raises:
        FrameTooLarge: the encoded body exceeds `MAX_BODY_BYTES`.
        ValueError: a sender name over `MAX_SENDER_BYTES` bytes or a negative ``seq``.
    """
    _check_secret(secret)
    sender_bytes = sender.encode()
    if len(sender_bytes) > MAX_SENDER_BYTES or not 0 <= seq < 1 << 64:
        raise ValueError(f"sender {sender!r} / seq {seq} out of range")
    body = _ENCODER.encode(message)
    if len(body) > MAX_BODY_BYTES:
        raise FrameTooLarge(f"{type(message).__name__} body is {len(body)} bytes, limit {MAX_BODY_BYTES}")
    header = HEADER.pack(MAGIC, PROTOCOL_VERSION, message.KIND, len(sender_bytes), len(body), seq)
    signed = header + sender_bytes + body
    return signed + hmac.new(secret, signed, hashlib.sha256).digest()


def decode_message(frame: bytes, secret: bytes) -> Message:
    """The message in an authenticated frame (`decode_frame` without sender and sequence).

    Raises:
        MalformedFrame, FrameTooLarge, UnknownVersion, BadMac: the frame is rejected.
    """
    return decode_frame(frame, secret).message


def decode_frame(frame: bytes, secret: bytes) -> Frame:
    """Sender, sequence number and message of an authenticated frame.

    The MAC is checked before the body is parsed, so unauthenticated bytes never reach the decoder.
    Freshness (is this ``seq`` new for this sender?) is the receiver's to judge: `messenger.freshness`.

    Raises:
        MalformedFrame, FrameTooLarge, UnknownVersion, BadMac: the frame is rejected.
    """
    _check_secret(secret)
    frame = bytes(frame)
    if len(frame) < HEADER.size + MAC_BYTES:
        raise MalformedFrame(f"frame of {len(frame)} bytes is shorter than header and MAC")
    magic, version, kind, sender_len, body_len, seq = HEADER.unpack_from(frame)
    if magic != MAGIC:
        raise MalformedFrame(f"bad magic {magic!r}: not a disaggsdk control frame")
    if body_len > MAX_BODY_BYTES:
        raise FrameTooLarge(f"declared body of {body_len} bytes exceeds {MAX_BODY_BYTES}")
    signed_len = HEADER.size + sender_len + body_len
    if len(frame) != signed_len + MAC_BYTES:
        raise MalformedFrame(f"frame is {len(frame)} bytes, header says {signed_len + MAC_BYTES}")
    signed, mac = frame[:signed_len], frame[signed_len:]
    if not hmac.compare_digest(mac, hmac.new(secret, signed, hashlib.sha256).digest()):
        raise BadMac("control frame failed authentication (wrong deployment secret or altered bytes)")
    if version != PROTOCOL_VERSION:
        raise UnknownVersion(f"protocol version {version}, this side speaks {PROTOCOL_VERSION}")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise MalformedFrame(f"unknown message kind {kind}")
    try:
        sender = signed[HEADER.size:HEADER.size + sender_len].decode()
        return Frame(sender, seq, decoder.decode(signed[HEADER.size + sender_len:]))
    except (UnicodeDecodeError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise MalformedFrame(f"{MESSAGE_TYPES[kind].__name__}: {exc}") from None
