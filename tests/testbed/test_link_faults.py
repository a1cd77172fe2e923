"""Link faults on a running testbed (issue 39 item 4): a link cut and healed, a share of packets
dropped, jitter. The default run checks the faults themselves (what tc/nft/ip show, a TCP stream
across a cut link and under loss, KV pages written between tcp endpoints under loss); the slow
cases run a prefill/decode deployment across two nodes through them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from disaggsdk.testbed import (
    LinkSpec,
    NetemUnavailable,
    PacketDropUnavailable,
    add_jitter,
    cut_link,
    down,
    drop_packets,
    heal_link,
    link_faults,
    link_is_cut,
    netem_available,
    nftables_available,
)
from disaggsdk.testbed.link_faults import FAULT_TABLE, LINK_LOSS_TABLE, drop_counts
from tests.testbed.conftest import netns_names
from tests.testbed.test_deployment_across_nodes import INITIATOR, TARGET

# node 1 listens, prints its port, then the byte count and sha256 of what arrived once the sender closed
RECEIVER = ("import hashlib, socket, sys\n"
            "s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)\n"
            "print(s.getsockname()[1], flush=True)\n"
            "c, _ = s.accept(); n = 0; h = hashlib.sha256()\n"
            "while (b := c.recv(1 << 16)):\n"
            "    n += len(b); h.update(b)\n"
            "print(n, h.hexdigest(), flush=True)\n")
# node 0 sends argv[3] bytes of a known pattern; argv[4] is its connect timeout, seconds; prints the pattern's digest
SENDER = ("import hashlib, socket, sys\n"
          "data = bytes(range(256)) * (int(sys.argv[3]) // 256)\n"
          "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[4]))\n"
          "c.settimeout(None); c.sendall(data); c.close()\n"
          "print(hashlib.sha256(data).hexdigest(), flush=True)\n")
STREAM_BYTES = 4 << 20
TRANSFER_TIMEOUT_S = 60.0

needs_nft = pytest.mark.skipif(not nftables_available(), reason="no `nft` here: apt-get install nftables (make sysdeps)")


class _Receiver:
    """RECEIVER in node ``node``, killed on leaving the block whatever happened."""

    def __init__(self, node):
        self.node = node
        self.proc = node.popen([sys.executable, "-c", RECEIVER, node.address])

    def __enter__(self) -> _Receiver:
        assert self.proc.stdout is not None
        self.port = self.proc.stdout.readline().strip()
        return self

    def result(self, timeout_s: float = TRANSFER_TIMEOUT_S) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout_s)
        count, digest = out.split()
        return int(count), digest

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _qdisc_kinds(namespace: str, device: str) -> list[tuple[str, str]]:
    shown = json.loads(subprocess.run(["tc", "-n", namespace, "-j", "qdisc", "show", "dev", device],
                                      capture_output=True, text=True, check=True).stdout)
    return [(q["kind"], q["handle"]) for q in shown]


def _tables(namespace: str) -> list[str]:
    listed = subprocess.run(["ip", "netns", "exec", namespace, "nft", "list", "tables"], capture_output=True,
                            text=True, check=True).stdout
    return sorted(line.split()[-1] for line in listed.splitlines() if line.startswith("table"))


def _gso_max_segs(namespace: str, device: str) -> int:
    shown = json.loads(subprocess.run(["ip", "-n", namespace, "-d", "-j", "link", "show", "dev", device],
                                      capture_output=True, text=True, check=True).stdout)
    return int(shown[0]["gso_max_segs"])


def _send(node, to, port: str, connect_timeout_s: float = 10.0, check: bool = True):
    return node.run([sys.executable, "-c", SENDER, to.address, port, str(STREAM_BYTES), str(connect_timeout_s)],
                    check=check, timeout_s=TRANSFER_TIMEOUT_S)


# cut and heal


def test_a_cut_link_carries_nothing_and_after_the_heal_it_does(testbed):
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=100))
    n0, n1 = tb.nodes
    qdiscs = _qdisc_kinds(n1.namespace, n1.interface)
    cut_link(tb, 1)
    assert link_is_cut(tb, 1) and not link_is_cut(tb, 0)
    shown = json.loads(n1.run(["ip", "-j", "link", "show", "dev", n1.interface]).stdout)[0]
    # the node's end keeps its address and qdiscs and has lost its carrier: a pulled cable
    assert "NO-CARRIER" in shown["flags"] and "UP" in shown["flags"]
    assert json.loads(n1.run(["ip", "-j", "-4", "addr", "show", "dev", n1.interface]).stdout)[0]["addr_info"]
    with _Receiver(n1) as receiver:
        refused = _send(n0, n1, receiver.port, connect_timeout_s=2.0, check=False)
        assert refused.returncode != 0 and "timed out" in refused.stderr  # silence, not a refusal
        heal_link(tb, 1)
        assert not link_is_cut(tb, 1)
        sent = _send(n0, n1, receiver.port).stdout.strip()
        assert receiver.result() == (STREAM_BYTES, sent)
    assert _qdisc_kinds(n1.namespace, n1.interface) == qdiscs  # the shaping is the link's own again


def test_a_stream_cut_mid_transfer_stalls_and_resumes_intact_after_the_heal(testbed):
    """TCP rides out a short cut: nothing arrives while it lasts, every byte arrives after it."""
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=10))  # 4 MiB take ~3.4 s: the cut lands mid-stream
    n0, n1 = tb.nodes
    with _Receiver(n1) as receiver:
        sender = n0.popen([sys.executable, "-c", SENDER, n1.address, receiver.port, str(STREAM_BYTES), "10"])
        try:
            while n1.link_counters().rx_bytes < STREAM_BYTES // 8:
                assert sender.poll() is None, sender.communicate()
                time.sleep(0.05)
            cut_link(tb, 1)
            time.sleep(0.2)  # what was on the wire has landed
            at_cut = n1.link_counters().rx_bytes
            time.sleep(2.0)
            assert n1.link_counters().rx_bytes == at_cut  # nothing crosses a cut link
            assert sender.poll() is None and receiver.proc.poll() is None
            heal_link(tb, 1)
            out, err = sender.communicate(timeout=TRANSFER_TIMEOUT_S)
            assert sender.returncode == 0, err
            assert receiver.result() == (STREAM_BYTES, out.strip())
        finally:
            if sender.poll() is None:
                sender.kill()
                sender.wait(10)


# dropped packets


@needs_nft
def test_one_percent_loss_drops_packets_each_way_and_a_stream_still_lands_intact(testbed):
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=100))
    n0, n1 = tb.nodes
    drop_packets(tb, 1, 1.0)
    assert _tables(n1.namespace) == [FAULT_TABLE] and _tables(n0.namespace) == []
    assert _tables(tb.switch_namespace) == [f"{FAULT_TABLE}_{n1.switch_port}"]
    rules = subprocess.run(["ip", "netns", "exec", n1.namespace, "nft", "list", "table", "netdev", FAULT_TABLE],
                           capture_output=True, text=True, check=True).stdout
    assert "hook ingress" in rules and f'"{n1.interface}"' in rules and "numgen random mod 10000 < 100" in rules
    # frames, not 64 KiB GSO skbs, cross the lossy link: both its ends segment what they send
    assert _gso_max_segs(n1.namespace, n1.interface) == _gso_max_segs(tb.switch_namespace, n1.switch_port) == 1
    with _Receiver(n1) as receiver:
        sent = _send(n0, n1, receiver.port).stdout.strip()
        assert receiver.result() == (STREAM_BYTES, sent)
    # ~2,900 data packets in at node 1, ~1,500 acks out through the switch's port: a 1% share of each
    # is tens of packets (none dropped at all has odds below 1e-6)
    assert drop_counts(n1.namespace)[FAULT_TABLE] > 0
    assert drop_counts(tb.switch_namespace)[f"{FAULT_TABLE}_{n1.switch_port}"] > 0
    heal_link(tb, 1)
    assert _tables(n1.namespace) == [] and _tables(tb.switch_namespace) == []
    assert _gso_max_segs(n1.namespace, n1.interface) == _gso_max_segs(tb.switch_namespace, n1.switch_port) == 65535


@needs_nft
def test_drop_packets_again_replaces_the_share_and_heal_is_idempotent(testbed):
    tb = testbed(nodes=1)
    node = tb.node(0)
    drop_packets(tb, 0, 1.0)
    drop_packets(tb, 0, 50.0)
    rules = subprocess.run(["ip", "netns", "exec", node.namespace, "nft", "list", "ruleset"], capture_output=True,
                           text=True, check=True).stdout
    assert rules.count("numgen random") == 1 and "< 5000" in rules
    heal_link(tb, 0)
    heal_link(tb, 0)
    assert _tables(node.namespace) == []
    with pytest.raises(ValueError, match="more than 0%"):
        drop_packets(tb, 0, 0)


def test_without_nft_or_netem_a_drop_says_what_to_install(testbed, monkeypatch):
    tb = testbed(nodes=1)
    monkeypatch.setattr(link_faults, "nftables_available", lambda: False)
    monkeypatch.setattr(link_faults, "netem_available", lambda namespace: False)
    with pytest.raises(PacketDropUnavailable, match=r"apt-get install nftables"):
        drop_packets(tb, 0, 1.0)


@needs_nft
def test_link_loss_without_netem_is_dropped_by_nftables_and_goes_with_the_testbed(testbed):
    """``--link RATE,0ms,LOSS`` on a kernel without sch_netem: the loss is an nft table in each node
    (met once between two nodes, on the receiver's ingress); set_link takes it away; down removes it
    with the namespace."""
    probe = testbed(nodes=1)
    if netem_available(probe.switch_namespace):
        pytest.skip("this kernel has sch_netem, which shapes the loss (test_testbed covers it)")
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=100, loss_pct=1))
    n0, n1 = tb.nodes
    assert _tables(n0.namespace) == _tables(n1.namespace) == [LINK_LOSS_TABLE]
    assert _tables(tb.switch_namespace) == []
    assert [kind for kind, _ in _qdisc_kinds(n0.namespace, n0.interface)] == ["tbf"]
    with _Receiver(n1) as receiver:
        sent = _send(n0, n1, receiver.port).stdout.strip()
        assert receiver.result() == (STREAM_BYTES, sent)
    assert drop_counts(n1.namespace)[LINK_LOSS_TABLE] > 0
    changed = tb.set_link(LinkSpec(rate_mbit=100))
    assert _tables(n0.namespace) == _tables(n1.namespace) == []
    tb = changed.set_link(LinkSpec(rate_mbit=100, loss_pct=2))
    assert "< 200" in subprocess.run(["ip", "netns", "exec", n1.namespace, "nft", "list", "ruleset"],
                                     capture_output=True, text=True, check=True).stdout
    # nft tables belong to their network namespace: `down` deletes the namespaces and the tables with them
    assert down(tb.name, tb.state_file.parent) is True
    assert not {n0.namespace, n1.namespace, tb.switch_namespace} & netns_names()
    with pytest.raises(NetemUnavailable, match=r"--link 100mbit,0ms,1%"):
        testbed(nodes=1, link=LinkSpec(rate_mbit=100, delay_ms=5, loss_pct=1))


# jitter


def test_jitter_of_50ms_varies_the_delay_where_netem_exists(testbed):
    tb = testbed(nodes=2)
    n0, n1 = tb.nodes
    if not netem_available(tb.switch_namespace):
        with pytest.raises(NetemUnavailable, match="sch_netem") as caught:
            add_jitter(tb, 1, 50)
        assert [kind for kind, _ in _qdisc_kinds(n1.namespace, n1.interface)] == ["tbf"]  # nothing half-added
        pytest.skip(f"no sch_netem on this kernel, so no jitter: {caught.value}")
    add_jitter(tb, 1, 50)
    shown = subprocess.run(["tc", "-n", n1.namespace, "qdisc", "show", "dev", n1.interface], capture_output=True,
                           text=True, check=True).stdout
    assert "delay 50ms  50ms" in shown or "delay 50ms 50ms" in shown, shown
    with _Receiver(n1) as receiver:  # node 1's acks come late and out of order; every byte still lands
        sent = _send(n0, n1, receiver.port).stdout.strip()
        assert receiver.result() == (STREAM_BYTES, sent)
    heal_link(tb, 1)
    assert [kind for kind, _ in _qdisc_kinds(n1.namespace, n1.interface)] == ["tbf"]


# the transport under loss


@needs_nft
def test_kv_pages_written_between_tcp_endpoints_under_one_percent_loss_land_intact(testbed):
    """libfabric's tcp provider over a lossy link: node 0 writes 4 MiB of pages into node 1's region
    with 1% of the packets each way dropped; every page's immediate arrives and the bytes match."""
    pytest.importorskip("disaggsdk.transfer._fabric")
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=1000))
    n0, n1 = tb.nodes
    drop_packets(tb, 1, 1.0)
    target = n1.popen([sys.executable, "-c", TARGET, n1.address])
    try:
        assert target.stdout is not None
        _, address, descriptor = target.stdout.readline().split()
        sent = n0.run([sys.executable, "-c", INITIATOR, n0.address, address, descriptor],
                      timeout_s=TRANSFER_TIMEOUT_S).stdout.split()
        received = target.stdout.readline().strip()
        assert target.wait(30) == 0
    finally:
        if target.poll() is None:
            target.kill()
            target.wait(10)
    assert received == sent[1]
    assert drop_counts(n1.namespace)[FAULT_TABLE] > 0  # the loss was there while the pages crossed
