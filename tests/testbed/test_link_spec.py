"""LinkSpec: ``--link RATE[,DELAY[,LOSS]]`` read into numbers with units, bad text refused with the
form to write, and the tc arguments it becomes. No root needed."""

from __future__ import annotations

import pytest

from disaggsdk.testbed.link import LinkSpec, netem_args, parse_delay_ms, parse_loss_pct, parse_rate_mbit, tbf_args


@pytest.mark.parametrize(("text", "rate_mbit"), [
    ("100mbit", 100.0), ("1gbit", 1000.0), ("2.5Gbit", 2500.0), ("800kbit", 0.8), ("5000bit", 0.005),
    ("1tbit", 1e6),
])
def test_rates_read_in_megabits(text, rate_mbit):
    assert parse_rate_mbit(text) == pytest.approx(rate_mbit)


@pytest.mark.parametrize(("text", "delay_ms"), [("5ms", 5.0), ("250us", 0.25), ("0.1s", 100.0), ("0ms", 0.0)])
def test_delays_read_in_milliseconds(text, delay_ms):
    assert parse_delay_ms(text) == pytest.approx(delay_ms)


def test_loss_reads_in_percent():
    assert parse_loss_pct("1%") == 1.0
    assert parse_loss_pct("0.5%") == 0.5


def test_a_full_link_and_its_short_forms():
    assert LinkSpec.parse("10mbit,20ms,1%") == LinkSpec(rate_mbit=10, delay_ms=20, loss_pct=1)
    assert LinkSpec.parse("1gbit") == LinkSpec(rate_mbit=1000)
    assert LinkSpec.parse(" 100mbit , 5ms ") == LinkSpec(rate_mbit=100, delay_ms=5)
    assert not LinkSpec(rate_mbit=100).needs_netem
    assert LinkSpec(rate_mbit=100, loss_pct=1).needs_netem


@pytest.mark.parametrize("link", [LinkSpec(100), LinkSpec(1000, 5), LinkSpec(10, 20, 1.5), LinkSpec(10, 0, 1)])
def test_describe_reads_back_as_the_same_link(link):
    assert LinkSpec.parse(link.describe()) == link
    assert LinkSpec.from_dict(link.to_dict()) == link


@pytest.mark.parametrize(("text", "says"), [
    ("100", "write a number and a bit unit"),
    ("100mbps", "write a number and a bit unit"),  # tc reads mbps as megabytes: refused
    ("fast", "write a number and a bit unit"),
    ("100mbit,5", "write a number and us, ms or s"),
    ("100mbit,5ms,1", "write a percentage"),
    ("100mbit,5ms,1%,x", "RATE[,DELAY[,LOSS]]"),
    ("", "RATE[,DELAY[,LOSS]]"),
    ("0mbit", "give at least 1kbit"),
    ("100mbit,0ms,100%", "less than 100%"),
])
def test_bad_links_say_what_to_write(text, says):
    with pytest.raises(ValueError) as caught:
        LinkSpec.parse(text)
    assert says in str(caught.value)


def test_tbf_rate_and_burst():
    args = tbf_args(LinkSpec(rate_mbit=1000))
    assert args[:3] == ["tbf", "rate", "1000000000bit"]
    assert int(args[args.index("burst") + 1]) == 250_000  # 2 ms at 1 Gbit/s
    slow = tbf_args(LinkSpec(rate_mbit=1))
    assert int(slow[slow.index("burst") + 1]) == 15_000  # never under ten 1500-byte frames


def test_netem_queue_holds_a_delay_at_line_rate():
    args = netem_args(LinkSpec(rate_mbit=1000, delay_ms=50, loss_pct=1))
    # 1 Gbit/s x 50 ms = 6.25 MB = 4167 frames in flight; twice that queued
    assert args == ["netem", "limit", "8334", "delay", "50ms", "loss", "1%"]
    assert netem_args(LinkSpec(rate_mbit=10, delay_ms=1))[:3] == ["netem", "limit", "1000"]
