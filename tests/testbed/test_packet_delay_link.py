"""The link's own delay without sch_netem (`--link RATE,DELAY` on this kernel): the user-space
packet delayer on every node's ingress holds what it receives, so a packet between two nodes
meets the delay once, and a jitter on one node's packets takes its place for them as netem's does."""

from __future__ import annotations

import statistics

import pytest

from disaggsdk.testbed import LinkSpec, add_jitter, down, heal_link, link_faults, netem_available, packet_delay
from tests.testbed.test_link_faults import STREAM_BYTES, _Receiver, _round_trips_ms, _send

LINK_DELAY_MS = 20.0


@pytest.fixture
def delayed(testbed):
    probe = testbed(nodes=1)
    if netem_available(probe.switch_namespace):
        pytest.skip("this kernel has sch_netem, which adds the link's delay (test_testbed covers it)")
    if not packet_delay.iptables_available():
        pytest.skip("no iptables for the user-space delayer: apt-get install iptables")
    return testbed(nodes=2, link=LinkSpec(rate_mbit=100, delay_ms=LINK_DELAY_MS))


def test_a_link_delay_without_netem_is_met_once_each_way_and_a_stream_lands_intact(delayed):
    tb = delayed
    n0, n1 = tb.nodes
    for node in tb.nodes:
        [delayer] = packet_delay.read_delayers(link_faults.link_delay_record(tb.state_file.parent, node.name))
        assert (delayer.namespace, delayer.source, delayer.delay_ms, delayer.jitter_ms) == \
            (node.namespace, None, LINK_DELAY_MS, 0)
        assert packet_delay.delayer_runs(delayer)
    round_trips = _round_trips_ms(n0, n1)
    # the delay is a floor (a packet is never released early); the ceiling only says "once each
    # way, not twice", with the loaded VM's own delays given plenty of room
    assert min(round_trips) >= 2 * LINK_DELAY_MS, round_trips
    assert statistics.median(round_trips) < 3 * LINK_DELAY_MS, round_trips
    with _Receiver(n1) as receiver:
        sent = _send(n0, n1, receiver.port).stdout.strip()
        assert receiver.result() == (STREAM_BYTES, sent)


def test_a_jitter_takes_the_place_of_the_link_delay_for_its_senders_packets(delayed):
    """node 1's packets wait 20 ± 5 ms (max(link delay, jitter) ± jitter), not the link's 20 ms as
    well: the jitter's rule is ahead of the link's, and a packet leaves the chain at its first queue."""
    tb = delayed
    n0, n1 = tb.nodes
    add_jitter(tb, 1, 5)
    [rule, link_rule] = packet_delay.delayer_rules(n0.namespace)
    assert f"-s {n1.address}/32" in rule and "-s " not in link_rule
    round_trips = _round_trips_ms(n0, n1)  # 20 ms to node 1, 15-25 ms back: 35-45 ms; both delays back: 55-65
    assert min(round_trips) >= 2 * LINK_DELAY_MS - 5 and statistics.median(round_trips) < 52, round_trips
    heal_link(tb, 1)
    assert len(packet_delay.delayer_rules(n0.namespace)) == 1  # the link's own delay stays
    assert min(_round_trips_ms(n0, n1)) >= 2 * LINK_DELAY_MS


def test_set_link_moves_the_delay_and_down_stops_the_delayers(delayed):
    tb = delayed
    records = [link_faults.link_delay_record(tb.state_file.parent, node.name) for node in tb.nodes]
    tb = tb.set_link(LinkSpec(rate_mbit=100, delay_ms=5))
    assert [[d.delay_ms for d in packet_delay.read_delayers(record)] for record in records] == [[5], [5]]
    tb = tb.set_link(LinkSpec(rate_mbit=100))
    assert not any(record.exists() for record in records)
    assert [packet_delay.delayer_rules(node.namespace) for node in tb.nodes] == [[], []]
    tb = tb.set_link(LinkSpec(rate_mbit=100, delay_ms=5))
    delayers = [d for record in records for d in packet_delay.read_delayers(record)]
    assert len(delayers) == 2 and all(packet_delay.delayer_runs(d) for d in delayers)
    assert down(tb.name, tb.state_file.parent) is True
    assert not any(packet_delay.delayer_runs(d) for d in delayers) and not any(record.exists() for record in records)
