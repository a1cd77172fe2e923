"""Testbeds on this machine (root and iproute2; skipped otherwise): nodes with their own addresses,
hostnames, /dev/shm, /tmp and processes; TCP between nodes through the shaped links, counted by
`status`; the host's namespace untouched; `down` leaving nothing, also after a failed `up`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from disaggsdk.testbed import (
    LinkSpec,
    NetemUnavailable,
    TestbedError,
    down,
    netem_available,
    nftables_available,
    status,
)
from disaggsdk.testbed import link as link_module
from disaggsdk.testbed import testbed as testbed_module
from disaggsdk.testbed.naming import namespace_prefix, state_path
from disaggsdk.testbed.node import host_paths_under_tmp, start_anchor
from tests.testbed.conftest import (
    host_mounts,
    host_network,
    netns_names,
    netns_skip_reason,
    pids_in_netns,
    running,
    unique_name,
)

# node 1 listens, prints its port, counts what arrives until the sender closes, prints the count
RECEIVER = ("import socket, sys\n"
            "s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen(1)\n"
            "print(s.getsockname()[1], flush=True)\n"
            "c, _ = s.accept(); n = 0\n"
            "while (b := c.recv(1 << 16)):\n"
            "    n += len(b)\n"
            "print(n, flush=True)\n")
SENDER = ("import socket, sys\n"
          "c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)\n"
          "c.sendall(bytes(int(sys.argv[3]))); c.close()\n")
TRANSFER_BYTES = 1 << 20


def _send_between(n0, n1) -> int:
    """Node 0 sends TRANSFER_BYTES to a TCP receiver in node 1; returns what node 1 counted."""
    receiver = n1.popen([sys.executable, "-c", RECEIVER, n1.address])
    try:
        port = receiver.stdout.readline().strip()
        n0.run([sys.executable, "-c", SENDER, n1.address, port, str(TRANSFER_BYTES)])
        received, _ = receiver.communicate(timeout=30)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    return int(received)


def _node_ipv4(node) -> list[str]:
    shown = json.loads(node.run(["ip", "-j", "-4", "addr", "show"]).stdout)
    return sorted(f"{a['local']}/{a['prefixlen']}" for link in shown for a in link["addr_info"] if link["ifname"] != "lo")


def test_two_nodes_have_their_own_addresses_hostnames_and_processes(testbed):
    tb = testbed(nodes=2)
    n0, n1 = tb.nodes
    assert (n0.address, n1.address) == ("198.18.0.10", "198.18.0.11")
    assert _node_ipv4(n0) == ["198.18.0.10/24"] and _node_ipv4(n1) == ["198.18.0.11/24"]
    hostnames = [node.run(["hostname"]).stdout.strip() for node in tb.nodes]
    assert hostnames == [n0.name, n1.name] and hostnames[0] != hostnames[1]
    assert os.uname().nodename not in hostnames  # the host keeps its own name
    # its own pid namespace: the node's /proc lists its anchor and the command, not the host's processes
    pids = n0.run(["sh", "-c", "ls /proc | grep -c '^[0-9]'"]).stdout.strip()
    assert int(pids) < 10
    # the only route is the testbed's /24: nothing a node sends can leave the testbed
    routes = json.loads(n0.run(["ip", "-j", "route", "show"]).stdout)
    assert [route["dst"] for route in routes] == ["198.18.0.0/24"]
    outside = n0.run([sys.executable, "-c", "import socket; socket.create_connection(('203.0.113.1', 9), timeout=2)"],
                     check=False)
    assert outside.returncode != 0 and "unreachable" in outside.stderr  # refused at once: no route, no packet


def test_dev_shm_and_tmp_of_a_node_are_its_own(testbed):
    tb = testbed(nodes=2)
    marker = f"testbed-marker-{os.getpid()}"
    for directory in ("/dev/shm", "/tmp"):
        tb.node(0).run(["sh", "-c", f"echo hello > {directory}/{marker}"])
        assert tb.node(0).run(["cat", f"{directory}/{marker}"]).stdout == "hello\n"
        assert tb.node(1).run(["test", "-e", f"{directory}/{marker}"], check=False).returncode == 1
        assert not os.path.exists(f"{directory}/{marker}")  # nor on the host


def test_host_paths_under_tmp_are_the_outermost_folders_under_tmp():
    assert host_paths_under_tmp(["/tmp/x", "/tmp/x/.venv", "/usr", "/home/me", "/tmp/h", "/tmpfoo/y"]) == ("/tmp/h", "/tmp/x")
    assert host_paths_under_tmp(["/work/main", "/usr"]) == ()


def test_a_node_sees_the_host_folders_it_runs_from_under_tmp_and_nothing_else_of_tmp(testbed, tmp_path, monkeypatch):
    """A checkout, venv or HOME under /tmp (``git clone ... /tmp/x``, ``HOME=$(mktemp -d)``) is in every
    node at its own path, the host's folder itself (a write is seen on the host); the rest of the
    host's /tmp is not there."""
    checkout, other = tmp_path / "checkout", tmp_path / "other"
    checkout.mkdir()
    other.mkdir()
    (checkout / "code.py").write_text("x = 1\n")
    runs_from = (*testbed_module.paths_nodes_run_from(), str(checkout))  # this Python's too: the anchor runs it
    monkeypatch.setattr(testbed_module, "paths_nodes_run_from", lambda: runs_from)
    node = testbed(nodes=1).node(0)
    assert node.run(["cat", str(checkout / "code.py")]).stdout == "x = 1\n"
    node.run(["sh", "-c", f"echo from-node > {checkout}/written"], cwd=str(checkout))
    assert (checkout / "written").read_text() == "from-node\n"
    assert node.run(["test", "-e", str(other)], check=False).returncode == 1
    bound = host_paths_under_tmp(runs_from)
    assert set(node.run(["ls", "-A", "/tmp"]).stdout.split()) == {p.split("/")[2] for p in bound}
    assert node.run(["ls", "-A", "/dev/shm"]).stdout.split() == []  # the bind's staging point is gone


def test_an_anchor_whose_python_the_node_cannot_see_fails_up_and_says_so(testbed, tmp_path, monkeypatch):
    monkeypatch.setattr(testbed_module, "start_anchor", lambda name, namespace, host_paths=(): start_anchor(
        name, namespace, host_paths, python=str(tmp_path / "venv" / "bin" / "python")))
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)  # on the host, not bound into the node
    with pytest.raises(TestbedError, match="is not in the node"):
        testbed(nodes=1)


def test_tcp_between_nodes_crosses_both_links_and_status_counts_it(testbed):
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=100))
    n0, n1 = tb.nodes
    _, before = status(tb.name, tb.state_file.parent)
    assert _send_between(n0, n1) == TRANSFER_BYTES
    _, after = status(tb.name, tb.state_file.parent)
    sent_by_0 = after[0].tx_bytes - before[0].tx_bytes
    got_by_1 = after[1].rx_bytes - before[1].rx_bytes
    # the payload plus its TCP/IP headers (~3%); the acks flow back, much smaller
    assert TRANSFER_BYTES <= sent_by_0 < 1.1 * TRANSFER_BYTES
    assert TRANSFER_BYTES <= got_by_1 < 1.1 * TRANSFER_BYTES
    assert 0 < after[1].tx_bytes - before[1].tx_bytes < TRANSFER_BYTES / 10
    assert all(node.alive for node in after)
    # the payload went through both shapers on its way: node 0's egress and the switch's port to node 1
    assert _tbf_sent_bytes(n0.namespace, n0.interface) >= TRANSFER_BYTES
    assert _tbf_sent_bytes(tb.switch_namespace, n1.switch_port) >= TRANSFER_BYTES


def _tbf_sent_bytes(namespace: str, device: str) -> int:
    shown = json.loads(subprocess.run(["tc", "-n", namespace, "-j", "-s", "qdisc", "show", "dev", device],
                                      capture_output=True, text=True, check=True).stdout)
    return sum(int(q["bytes"]) for q in shown if q["kind"] == "tbf")


def test_each_link_is_shaped_at_its_rate_on_both_ends(testbed):
    tb = testbed(nodes=1, link=LinkSpec(rate_mbit=200))
    node = tb.node(0)
    for namespace, device in ((node.namespace, node.interface), (tb.switch_namespace, node.switch_port)):
        shown = json.loads(subprocess.run(["tc", "-n", namespace, "-j", "qdisc", "show", "dev", device],
                                          capture_output=True, text=True, check=True).stdout)
        tbf = [q for q in shown if q["kind"] == "tbf"]
        assert len(tbf) == 1 and tbf[0]["options"]["rate"] == 200e6 / 8  # bytes per second


def test_set_link_reshapes_every_link_in_place_and_records_it(testbed):
    """A rate sweep reshapes the running testbed: both ends of each link get the new rate, the state
    file says it, and traffic still crosses."""
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=200))
    changed = tb.set_link(LinkSpec(rate_mbit=50))
    for node in tb.nodes:
        for namespace, device in ((node.namespace, node.interface), (tb.switch_namespace, node.switch_port)):
            shown = json.loads(subprocess.run(["tc", "-n", namespace, "-j", "qdisc", "show", "dev", device],
                                              capture_output=True, text=True, check=True).stdout)
            assert [q["options"]["rate"] for q in shown if q["kind"] == "tbf"] == [50e6 / 8]
    assert changed.link.rate_mbit == 50
    assert json.loads(tb.state_file.read_text())["link"]["rate_mbit"] == 50
    n0, n1 = tb.nodes
    assert _send_between(n0, n1) == TRANSFER_BYTES
    assert _tbf_sent_bytes(n0.namespace, n0.interface) >= TRANSFER_BYTES  # through the new qdisc


def test_the_host_namespace_is_untouched_and_down_leaves_nothing(testbed):
    network, mounts = host_network(), host_mounts()
    tb = testbed(nodes=2)
    worker = tb.node(1).popen(["sleep", "600"])  # a process of the node's, still running at `down`
    assert host_network() == network  # no interface, address or qdisc on the host while it is up
    pids = [pid for node in tb.nodes for pid in pids_in_netns(node.namespace)]
    assert len(pids) >= 5  # two anchors and their unshares, the worker (and its nsenter)
    assert down(tb.name, tb.state_file.parent) is True
    assert worker.wait(10) != 0  # killed with its node
    assert [pid for pid in pids if running(pid)] == []
    assert not {ns for ns in netns_names() if ns.startswith(namespace_prefix(tb.name))}
    assert host_mounts() == mounts
    assert host_network() == network
    assert not tb.state_file.exists()
    assert down(tb.name, tb.state_file.parent) is False  # again: nothing to do, no error


def test_a_node_whose_anchor_died_shows_down_and_down_still_clears_it(testbed):
    tb = testbed(nodes=2)
    lost = tb.node(1)
    os.kill(lost.anchor_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while running(lost.anchor_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    _, nodes = status(tb.name, tb.state_file.parent)
    assert [node.alive for node in nodes] == [True, False]
    assert down(tb.name, tb.state_file.parent) is True
    assert not os.path.exists(f"/proc/{lost.unshare_pid}")  # reaped, not left a zombie of this process
    assert not {ns for ns in netns_names() if ns.startswith(namespace_prefix(tb.name))}


def test_a_failure_half_way_through_up_tears_down_what_was_built(testbed, monkeypatch):
    anchors = []
    real_start_anchor = testbed_module.start_anchor

    def start_anchor_then_fail(name, namespace, host_paths=()):
        if anchors:
            raise TestbedError("the second anchor fails")
        anchors.append(real_start_anchor(name, namespace, host_paths))
        return anchors[-1]

    monkeypatch.setattr(testbed_module, "start_anchor", start_anchor_then_fail)
    network, mounts = host_network(), host_mounts()
    name_before = set(netns_names())
    with pytest.raises(TestbedError, match="the second anchor fails"):
        testbed(nodes=3)
    assert set(netns_names()) == name_before
    assert anchors and not any(running(pid) for pid in anchors[0])
    assert host_network() == network and host_mounts() == mounts


def test_down_clears_the_leftovers_of_a_testbed_without_a_state_file(tmp_path):
    reason = netns_skip_reason()
    if reason:
        pytest.skip(reason)
    name = unique_name()
    namespace = f"{namespace_prefix(name)}n0"
    subprocess.run(["ip", "netns", "add", namespace], check=True)
    stray = subprocess.Popen(["ip", "netns", "exec", namespace, "sleep", "600"])
    try:
        deadline = time.monotonic() + 10
        while stray.pid not in pids_in_netns(namespace) and time.monotonic() < deadline:
            time.sleep(0.01)  # until `ip netns exec` has entered the namespace
        assert stray.pid in pids_in_netns(namespace)
        assert down(name, tmp_path) is True
        assert stray.wait(10) != 0
        assert namespace not in netns_names()
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
    assert not state_path(name, tmp_path).exists()


def test_delay_needs_netem_or_iptables_and_loss_without_it_takes_nftables(testbed, monkeypatch):
    probe = testbed(nodes=1)
    with_delay = LinkSpec(rate_mbit=100, delay_ms=5, loss_pct=1)
    if not netem_available(probe.switch_namespace):
        names_before = set(netns_names())
        # without iptables the user-space delayer cannot hold the delay (test_packet_delay_link runs it)
        monkeypatch.setattr(link_module, "iptables_available", lambda: False)
        with pytest.raises(NetemUnavailable) as caught:
            testbed(nodes=2, link=with_delay)
        # the message offers the link this kernel can shape: the rate and the loss, no delay
        assert "apt-get install iptables" in str(caught.value) and "--link 100mbit,0ms,1%" in str(caught.value)
        assert set(netns_names()) == names_before  # the half-built testbed is gone
        if nftables_available():  # the loss alone builds (tests/testbed/test_link_faults.py drives it)
            lossy = testbed(nodes=1, link=LinkSpec(rate_mbit=100, loss_pct=1))
            shown = subprocess.run(["tc", "-n", lossy.node(0).namespace, "qdisc", "show", "dev",
                                    lossy.node(0).interface], capture_output=True, text=True, check=True).stdout
            assert [line.split()[1] for line in shown.splitlines()] == ["tbf"], shown
        return
    tb = testbed(nodes=1, link=with_delay)
    node = tb.node(0)
    shown = subprocess.run(["tc", "-n", node.namespace, "qdisc", "show", "dev", node.interface],
                           capture_output=True, text=True, check=True).stdout
    netem = [line for line in shown.splitlines() if line.startswith("qdisc netem")]
    assert len(netem) == 1 and " delay 5ms" in netem[0] and " loss 1%" in netem[0], shown
    assert any(line.startswith("qdisc tbf") for line in shown.splitlines()), shown
