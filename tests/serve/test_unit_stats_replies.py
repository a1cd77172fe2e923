"""The router's collection of unit stats answers: a question waits for the healthy units it asked."""

from disaggsdk.launch import messages as ch
from disaggsdk.serve.routing.unit_stats_replies import UnitStatsReplies
from tests.serve.test_router import stats


class Units:
    """Units that answer a GetStats at once, except the ones told to keep quiet."""

    def __init__(self, quiet=(), unhealthy=()):
        self.quiet, self.unhealthy = set(quiet), set(unhealthy)
        self.replies: UnitStatsReplies | None = None

    def send(self, name, msg):
        if name in self.unhealthy:
            return False
        if name not in self.quiet:
            self.replies.received(stats(name, "decode", msg.seq))
        return True

    def is_healthy(self, name):
        return name not in self.unhealthy


def test_gather_returns_every_answer_and_skips_units_that_cannot_answer():
    units = Units(unhealthy={"d1"})
    replies = units.replies = UnitStatsReplies(units)
    got = replies.gather(["d0", "d1", "p0"], 5, ch.GetStats(5), timeout_s=5.0)
    assert set(got) == {"d0", "p0"} and all(s.seq == 5 for s in got.values())
    assert set(replies.last()) == {"d0", "p0"}


def test_gather_gives_up_on_a_silent_unit_after_the_timeout_and_keeps_what_came():
    units = Units(quiet={"d0"})
    replies = units.replies = UnitStatsReplies(units)
    assert set(replies.gather(["d0", "p0"], 6, ch.GetStats(6), timeout_s=0.2)) == {"p0"}
    replies.received(stats("d0", "decode", 6))  # a late answer: no longer awaited, still the latest
    assert replies.last()["d0"].seq == 6


def test_a_dead_units_gauges_go():
    units = Units()
    replies = units.replies = UnitStatsReplies(units)
    replies.gather(["d0", "p0"], 7, ch.GetStats(7), timeout_s=5.0)
    replies.unit_down("d0")
    assert set(replies.last()) == {"p0"}
