"""TransportWatchdog: when a unit gives up on its transport, and whom it blames."""

from __future__ import annotations

from disaggsdk.launch.transport_watchdog import CHECK_EVERY_S, TransportWatchdog
from disaggsdk.transfer.descriptors import Peer


class FakeTransfer:
    """A transfer engine whose `health` reads are set by the test."""

    def __init__(self) -> None:
        self.age_s, self.posting = 0.0, None
        self.health = self

    def round_age_s(self) -> float:
        return self.age_s

    def posting_to(self):
        return self.posting


def test_a_thread_going_round_is_never_reported():
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=5.0)
    transfer.age_s = 4.9
    assert all(dog.check(t * CHECK_EVERY_S) is None for t in range(20))


def test_a_stuck_thread_names_the_peer_it_was_sending_to():
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=5.0)
    dog.know_peer(b"addr-d0", "decode-0#a1")
    assert dog.check(100.0) is None
    transfer.age_s, transfer.posting = 5.5, Peer(3, b"addr-d0")
    stuck = dog.check(100.0 + CHECK_EVERY_S)
    assert stuck is not None and stuck.poisoned_peer == "decode-0#a1" and stuck.stuck_s == 5.5


def test_stuck_reading_its_own_queue_blames_nobody_and_checks_are_spaced():
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=1.0)
    assert dog.check(10.0) is None
    transfer.age_s = 3.0
    assert dog.check(10.0 + CHECK_EVERY_S / 2) is None  # not looked at again so soon
    stuck = dog.check(10.0 + CHECK_EVERY_S)
    assert stuck is not None and stuck.poisoned_peer is None


def test_an_address_it_never_learnt_is_still_reported():
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=1.0)
    transfer.age_s, transfer.posting = 2.0, Peer(0, b"somebody")
    assert dog.check(0.0) is None  # the first check only starts the count
    assert dog.check(CHECK_EVERY_S).poisoned_peer == "unknown peer"


def test_a_whole_process_stopped_longer_than_the_limit_is_not_a_stuck_thread():
    """SIGSTOP (or a paused VM) stops the loop and the thread alike: at the loop's first check after
    it, the thread's round is as old as the stop. It gets until the next check to go round."""
    transfer = FakeTransfer()
    dog = TransportWatchdog(transfer, stuck_after_s=5.0)
    assert dog.check(10.0) is None
    transfer.age_s = 6.1  # stopped 6 s between two rounds of the loop
    assert dog.check(16.1) is None
    transfer.age_s = 0.0  # continued: the thread went round
    assert dog.check(16.1 + CHECK_EVERY_S) is None
    transfer.age_s = 7.0  # really stuck: the next check close after this one reports it
    assert dog.check(16.1 + 2 * CHECK_EVERY_S) is not None
