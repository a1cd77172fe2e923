"""The figures a KV transfer across a shaped link is judged by (`disaggsdk.bench.link_figures`)."""

from __future__ import annotations

import pytest

from disaggsdk.bench.link_figures import (
    exposed_floor_s,
    goodput_fraction,
    line_transfer_s,
    rate_for_ratio_mbit,
    strict_exposed_floor_s,
    wire_transfer_s,
)


def test_line_transfer_is_bits_over_the_rate():
    assert line_transfer_s(125_000_000, 1000) == pytest.approx(1.0)  # 1 Gbit at 1 Gbit/s
    assert line_transfer_s(1 << 20, 8) == pytest.approx((1 << 20) * 8 / 8e6)


def test_the_wire_time_counts_the_headers_tcp_adds():
    assert wire_transfer_s(1448, 1514 * 8 / 1e6) == pytest.approx(1.0)  # one full frame's payload a second


def test_the_floor_is_the_last_layer_when_the_link_keeps_up_and_the_overhang_when_it_does_not():
    # T < C: only the last layer's share is left after the forward
    assert exposed_floor_s(0.4, 1.0, 4) == pytest.approx(0.1)
    # T == C: still one layer's share (T - C + T/L = T/L)
    assert exposed_floor_s(1.0, 1.0, 4) == pytest.approx(0.25)
    # T = 3C: the transfer overhangs the forward by T - C, plus a layer's share
    assert exposed_floor_s(3.0, 1.0, 4) == pytest.approx(2.75)


def test_the_strict_floor_counts_the_first_layer_the_link_waits_for():
    assert strict_exposed_floor_s(0.4, 1.0, 4) == pytest.approx(0.1)  # the link keeps up: T/L as above
    assert strict_exposed_floor_s(3.0, 1.0, 4) == pytest.approx(2.25)  # T - C + C/L, under the 2.75
    assert strict_exposed_floor_s(3.0, 1.0, 4) <= exposed_floor_s(3.0, 1.0, 4)


def test_the_rate_for_a_ratio_makes_the_transfer_that_many_times_the_compute():
    rate = rate_for_ratio_mbit(8 << 20, 0.2, 3.0)
    assert line_transfer_s(8 << 20, rate) == pytest.approx(0.6)


def test_goodput_is_the_line_time_over_the_measured_time():
    assert goodput_fraction(125_000_000, 1.25, 1000) == pytest.approx(0.8)


@pytest.mark.parametrize("call", [lambda: line_transfer_s(1, 0), lambda: exposed_floor_s(1, 1, 0),
                                  lambda: exposed_floor_s(-1, 1, 4),
                                  lambda: strict_exposed_floor_s(1, 1, 0), lambda: rate_for_ratio_mbit(1, 0, 1),
                                  lambda: rate_for_ratio_mbit(1, 1, 0), lambda: goodput_fraction(1, 0, 1),
                                  lambda: wire_transfer_s(1, 0)])
def test_impossible_inputs_are_refused(call):
    with pytest.raises(ValueError):
        call()
