"""Messages between the launcher (parent) and its unit processes, over a multiprocessing pipe.

Typed msgspec structs encoded as msgpack and moved with ``Connection.send_bytes`` /
``recv_bytes``: nothing a unit says is ever unpickled by the parent (shared/LESSONS.md).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from disaggsdk.engine.sampling_params import SamplingParams
from disaggsdk.messenger.peers import UnitInfo
from disaggsdk.messenger.stats import RequestTransfer


# parent -> unit


class Peers(msgspec.Struct, frozen=True, tag=True):
    units: list[UnitInfo]


class Generate(msgspec.Struct, frozen=True, tag=True):
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams  # a plain dataclass: msgspec encodes it and re-runs its checks on decode


class Abort(msgspec.Struct, frozen=True, tag=True):
    request_id: str


class PeerDown(msgspec.Struct, frozen=True, tag=True):
    name: str


class GetStats(msgspec.Struct, frozen=True, tag=True):
    seq: int  # 0: a refresh nobody waits for
    with_recent: bool = False  # include the per-request records (large; the benchmark wants them)


class Shutdown(msgspec.Struct, frozen=True, tag=True):
    pass


# unit -> parent


class Ready(msgspec.Struct, frozen=True, tag=True):
    info: UnitInfo


class Started(msgspec.Struct, frozen=True, tag=True):
    name: str


class Logprob(msgspec.Struct, frozen=True, array_like=True):
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = []


class Tokens(msgspec.Struct, frozen=True, tag=True):
    request_id: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[Logprob] = []


class UnitStats(msgspec.Struct, frozen=True, tag=True):
    seq: int
    name: str
    role: str
    running: int
    waiting: int
    num_free_pages: int  # the same on every tp rank: one allocator serves all of them
    num_pages: int
    transfer_bytes: int
    transfer_writes: int
    transfer_s: float
    exposed_transfer_s: float
    transfer_failures: int
    requests_retried: int
    prefilled_locally: int
    rejected_frames: dict[str, int]
    rejected_requests: dict[str, int]
    recent: list[RequestTransfer]


class Fatal(msgspec.Struct, frozen=True, tag=True):
    message: str


ToUnit = Union[Peers, Generate, Abort, PeerDown, GetStats, Shutdown]
FromUnit = Union[Ready, Started, Tokens, UnitStats, Fatal]
_ENCODER = msgspec.msgpack.Encoder()
_TO_UNIT = msgspec.msgpack.Decoder(ToUnit)
_FROM_UNIT = msgspec.msgpack.Decoder(FromUnit)


def send(conn: Any, msg: msgspec.Struct) -> None:
    """Send one message over a `multiprocessing.connection.Connection`."""
    conn.send_bytes(_ENCODER.encode(msg))


def recv_to_unit(conn: Any) -> Any:
    """The next parent -> unit message."""
    return _TO_UNIT.decode(conn.recv_bytes())


def recv_from_unit(conn: Any) -> Any:
    """The next unit -> parent message (msgspec validates every field)."""
    return _FROM_UNIT.decode(conn.recv_bytes())
