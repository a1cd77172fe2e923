"""The context payload: hidden state and logits of a request's last prefilled position.

Written by prefill into the decode's context slot as one write, checked at both ends. A slot::

    header (32 bytes): magic b"DKCX" | version u16 | reserved u16 | hidden_size u32 |
                       vocab_size u32 | forward_end_s f64 | num_cached_tokens u64
    hidden_state: [hidden_size], float32
    logits:       [vocab_size], float32
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from disaggsdk.errors import DisaggError

_HEADER = struct.Struct("<4sHHIIdQ")
_MAGIC, _VERSION = b"DKCX", 1
_FLOAT_BYTES = 4


class ContextShapeError(DisaggError):
    """A context payload does not have the shape this model needs."""


@dataclass(frozen=True)
class ContextPayload:
    hidden_state: array[float]  # [hidden_size], float32
    logits: array[float]  # [vocab_size], float32
    forward_end_s: float
    num_cached_tokens: int = 0


def context_bytes(hidden_size: int, vocab_size: int) -> int:
    """Bytes of one context slot for a model."""
    return _HEADER.size + _FLOAT_BYTES * (hidden_size + vocab_size)


def pack_context(out: memoryview, hidden_state: Sequence[float], logits: Sequence[float], forward_end_s: float,
                 num_cached_tokens: int = 0) -> int:
    """Write a payload into ``out`` (a slot of the staging buffer).

    Returns:
        The bytes written.
    Raises:
        ContextShapeError: the slot is too small for these shapes.
    """
    hidden, logit = array("f", hidden_state), array("f", logits)
    size = context_bytes(len(hidden), len(logit))
    if len(out) < size:
        raise ContextShapeError(f"context slot of {len(out)} bytes cannot hold {size}; size slots with context_bytes()")
    _HEADER.pack_into(out, 0, _MAGIC, _VERSION, 0, len(hidden), len(logit), forward_end_s,
                      num_cached_tokens)
    start = _HEADER.size
    out[start : start + len(hidden) * _FLOAT_BYTES] = hidden.tobytes()
    start += len(hidden) * _FLOAT_BYTES
    out[start : start + len(logit) * _FLOAT_BYTES] = logit.tobytes()
    return size


def unpack_context(data: memoryview | bytes, hidden_size: int, vocab_size: int) -> ContextPayload:
    """Read and check a payload.

    Raises:
        ContextShapeError: bad magic or version, or shapes other than (hidden_size, vocab_size).
    """
    if len(data) < context_bytes(hidden_size, vocab_size):
        raise ContextShapeError(f"context of {len(data)} bytes, need {context_bytes(hidden_size, vocab_size)}")
    magic, version, _r, hidden_n, vocab_n, forward_end_s, num_cached = _HEADER.unpack_from(data, 0)
    if magic != _MAGIC or version != _VERSION:
        raise ContextShapeError(f"context slot holds no version-{_VERSION} payload (magic {magic!r}): prefill did not write it")
    if (hidden_n, vocab_n) != (hidden_size, vocab_size):
        raise ContextShapeError(f"context has hidden state [{hidden_n}] and logits [{vocab_n}], this model needs "
                                f"[{hidden_size}] and [{vocab_size}]: prefill and decode run different models")
    start = _HEADER.size
    hidden = array("f", bytes(data[start : start + hidden_n * _FLOAT_BYTES]))
    start += hidden_n * _FLOAT_BYTES
    logits = array("f", bytes(data[start : start + vocab_n * _FLOAT_BYTES]))
    return ContextPayload(hidden, logits, forward_end_s, num_cached)


def clear_context(out: memoryview) -> None:
    """Erase a slot's header so a stale payload is never read as a new one."""
    out[: _HEADER.size] = bytes(_HEADER.size)
