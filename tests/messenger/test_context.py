"""The context payload round-trips and its shape is checked at the decode end."""

from __future__ import annotations

import pytest

from disaggsdk.messenger.context import (
    ContextShapeError,
    clear_context,
    context_bytes,
    pack_context,
    unpack_context,
)


def test_round_trip_keeps_values_and_timestamp():
    buf = memoryview(bytearray(context_bytes(4, 6)))
    assert pack_context(buf, [1.0, 2.0, 3.0, 4.5], [0.25] * 6, 12.5) == len(buf)
    got = unpack_context(buf, 4, 6)
    assert list(got.hidden_state) == [1.0, 2.0, 3.0, 4.5] and list(got.logits) == [0.25] * 6
    assert got.forward_end_s == 12.5


def test_wrong_shape_or_no_payload_is_refused():
    buf = memoryview(bytearray(context_bytes(4, 6)))
    pack_context(buf, [0.0] * 4, [0.0] * 6, 1.0)
    with pytest.raises(ContextShapeError, match="different models"):
        unpack_context(buf, 4, 5)
    clear_context(buf)
    with pytest.raises(ContextShapeError, match="did not write"):
        unpack_context(buf, 4, 6)
    with pytest.raises(ContextShapeError, match="cannot hold"):
        pack_context(memoryview(bytearray(10)), [0.0] * 4, [0.0] * 6, 1.0)
    with pytest.raises(ContextShapeError, match="need"):
        unpack_context(b"\0" * 8, 4, 6)
