"""Link faults on a running testbed (issue 39 item 4): a link cut and healed, a share of packets
dropped, jitter. The default run checks the faults themselves (what tc/nft/ip show, a TCP stream
across a cut link and under loss, KV pages written between tcp endpoints under loss); the slow
cases run a prefill/decode deployment across two nodes through them.
"""

from __future__ import annotations

import json
import signal
import statistics
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
    packet_delay,
)
from disaggsdk.testbed.link_faults import FAULT_TABLE, LINK_LOSS_TABLE, drop_counts
from tests.testbed.conftest import netns_names
from tests.testbed.test_deployment_across_nodes import write_pages_across

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


# jitter

# node 1 echoes every UDP datagram back to its sender; prints its port first
ECHO = ("import socket, sys\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((sys.argv[1], 0))\n"
        "print(s.getsockname()[1], flush=True)\n"
        "while True:\n"
        "    data, peer = s.recvfrom(64); s.sendto(data, peer)\n")
# node 0 sends argv[3] numbered datagrams one after another, each awaited (argv[4] s at most);
# prints the round trips in ms as JSON
ECHO_CLIENT = ("import json, socket, sys, time\n"
               "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect((sys.argv[1], int(sys.argv[2])))\n"
               "rtts = []\n"
               "for n in range(int(sys.argv[3])):\n"
               "    s.settimeout(float(sys.argv[4])); start = time.monotonic(); s.send(str(n).encode())\n"
               "    while s.recv(64) != str(n).encode():\n"
               "        pass  # a late echo of an earlier datagram\n"
               "    rtts.append((time.monotonic() - start) * 1e3)\n"
               "print(json.dumps(rtts), flush=True)\n")
NUM_ECHOES = 50
ECHO_TIMEOUT_S = 5.0  # one round trip longer than this is a lost or stuck datagram, never a jitter


def _round_trips_ms(node, to) -> list[float]:
    """NUM_ECHOES UDP round trips from ``node`` to ``to`` and back, milliseconds."""
    server = to.popen([sys.executable, "-c", ECHO, to.address])
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        done = node.run([sys.executable, "-c", ECHO_CLIENT, to.address, port, str(NUM_ECHOES), str(ECHO_TIMEOUT_S)],
                        timeout_s=NUM_ECHOES * ECHO_TIMEOUT_S)
        return json.loads(done.stdout)
    finally:
        server.kill()
        server.wait(10)


def _nft_tables(namespace: str) -> list[str]:
    # every nftables table of the namespace, any family (iptables-nft's `ip mangle` among them)
    listed = subprocess.run(["ip", "netns", "exec", namespace, "nft", "list", "tables"], capture_output=True,
                            text=True, check=True).stdout
    return sorted(line.split(None, 1)[1] for line in listed.splitlines() if line.startswith("table"))


def test_jitter_of_50ms_varies_the_delay_each_packet_meets_and_a_stream_lands_intact(testbed):
    """50 ms of jitter on node 1's link: node 1's echoes come back 0-100 ms late, each by its own
    draw (netem where the kernel has it, the user-space delayer on node 0's ingress elsewhere); a
    4 MiB stream whose acks are delayed and reordered so still lands whole; the heal leaves no trace."""
    tb = testbed(nodes=2)
    n0, n1 = tb.nodes
    by_netem = netem_available(tb.switch_namespace)
    if not by_netem and not packet_delay.iptables_available():
        with pytest.raises(NetemUnavailable, match="apt-get install iptables"):
            add_jitter(tb, 1, 50)
        pytest.skip("no sch_netem and no iptables for the user-space delayer: apt-get install iptables")
    record = link_faults.jitter_record(tb, 1)
    tables_before = _nft_tables(n0.namespace) if nftables_available() else []
    unjittered = _round_trips_ms(n0, n1)
    add_jitter(tb, 1, 50)
    if by_netem:
        shown = subprocess.run(["tc", "-n", n1.namespace, "qdisc", "show", "dev", n1.interface],
                               capture_output=True, text=True, check=True).stdout
        assert "delay 50ms  50ms" in shown or "delay 50ms 50ms" in shown, shown
    else:
        [delayer] = packet_delay.read_delayers(record)  # on node 0's ingress, for node 1's packets
        assert (delayer.namespace, delayer.source, delayer.delay_ms, delayer.jitter_ms) == \
            (n0.namespace, n1.address, 50, 50)
        assert packet_delay.delayer_runs(delayer)
        [rule] = packet_delay.delayer_rules(n0.namespace)
        assert f"-s {n1.address}/32 -i {n0.interface}" in rule and "NFQUEUE" in rule, rule
        assert packet_delay.delayer_rules(n1.namespace) == []
    jittered = _round_trips_ms(n0, n1)
    with _Receiver(n1) as receiver:  # node 1's acks come late and out of order; every byte still lands
        started = time.monotonic()
        sent = _send(n0, n1, receiver.port).stdout.strip()
        assert receiver.result() == (STREAM_BYTES, sent)
        stream_s = time.monotonic() - started
    _report(case="50 ms jitter, no deployment", by="netem" if by_netem else "user-space delayer",
            unjittered_ms=[min(unjittered), statistics.median(unjittered), max(unjittered)],
            jittered_ms=[min(jittered), statistics.median(jittered), max(jittered)],
            stream_4mib_s=stream_s)
    # each echo waits uniform(0, 100) ms: of 50, some wait little and some long (the odds of none
    # under 30 ms, or of a spread under 40 ms, are below 1e-7); the bounds leave the loaded VM's
    # own delays plenty of room
    assert statistics.median(unjittered) < 20, unjittered
    assert min(jittered) < 30 and max(jittered) - min(jittered) > 40, jittered
    assert statistics.median(jittered) > statistics.median(unjittered) + 15, (unjittered, jittered)
    heal_link(tb, 1)
    assert [kind for kind, _ in _qdisc_kinds(n1.namespace, n1.interface)] == ["tbf"]
    if not by_netem:
        assert not packet_delay.delayer_runs(delayer) and not record.exists()
        assert packet_delay.delayer_rules(n0.namespace) == []
    if nftables_available():
        assert _nft_tables(n0.namespace) == tables_before  # iptables-nft's emptied table is gone too
    assert statistics.median(_round_trips_ms(n0, n1)) < 20


def test_jitter_again_replaces_the_delayers_and_down_stops_them(testbed):
    """Without sch_netem, on three nodes: node 2's jitter is held on the ingress of nodes 0 and 1; a
    second add_jitter stops those delayers and starts ones with the new jitter (one rule each);
    `down` stops them and removes the record; a heal without jitter is a no-op."""
    tb = testbed(nodes=3)
    if netem_available(tb.switch_namespace):
        pytest.skip("this kernel has sch_netem, which adds the jitter (the test above covers it)")
    if not packet_delay.iptables_available():
        pytest.skip("no iptables for the user-space delayer: apt-get install iptables")
    record = link_faults.jitter_record(tb, 2)
    heal_link(tb, 2)  # nothing to heal: no record, no iptables call
    add_jitter(tb, 2, 50)
    first = packet_delay.read_delayers(record)
    add_jitter(tb, 2, 20)
    second = packet_delay.read_delayers(record)
    assert [d.namespace for d in first] == [d.namespace for d in second] == [tb.node(0).namespace,
                                                                             tb.node(1).namespace]
    assert not any(packet_delay.delayer_runs(d) for d in first)
    assert all(packet_delay.delayer_runs(d) and (d.delay_ms, d.jitter_ms) == (20, 20) for d in second)
    assert [len(packet_delay.delayer_rules(node.namespace)) for node in tb.nodes] == [1, 1, 0]
    assert down(tb.name, tb.state_file.parent) is True
    assert not any(packet_delay.delayer_runs(d) for d in second) and not record.exists()
    assert not packet_delay.records_of(tb.state_file.parent, tb.name)


# the transport under loss


@needs_nft
def test_kv_pages_written_between_tcp_endpoints_under_one_percent_loss_land_intact(testbed):
    """libfabric's tcp provider over a lossy link: node 0 writes 4 MiB of pages into node 1's region
    with 1% of the packets each way dropped; every page's immediate arrives and the bytes match."""
    pytest.importorskip("disaggsdk.transfer._fabric")
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=1000))
    n0, n1 = tb.nodes
    drop_packets(tb, 1, 1.0)
    _, sent, received = write_pages_across(n0, n1, timeout_s=TRANSFER_TIMEOUT_S)
    assert received == sent[1]
    assert drop_counts(n1.namespace)[FAULT_TABLE] > 0  # the loss was there while the pages crossed


# a deployment across two nodes through the faults (slow: a Ray cluster and two units)

DEADLINE_S = 5.0  # transfer.deadline_s: how long decode waits for a request's KV before it retries
HANG_BOUND_S = DEADLINE_S + 55.0  # a request still open this long after it was sent hangs
SHORT_PROMPTS = [list(range(40 + k, 240 + k)) for k in range(3)]  # 200 tokens: 0.8 MiB of KV each
# 2,000 tokens: 8 MiB of KV (4 layers, 4 KV heads of 32 float32 each, K and V), ~3.4 s at 20 Mbit/s
LONG_PROMPT = [(7 * k) % 4000 + 10 for k in range(2000)]
MAX_TOKENS = 8
SLOW_LINK = LinkSpec(rate_mbit=20)
FAST_LINK = LinkSpec(rate_mbit=1000)
# run in node 0: one completion; prints its tokens or its error, and how long it took
ASK = """import json, sys, time, openai
client = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="none", timeout=float(sys.argv[4]), max_retries=0)
model = client.models.list().data[0].id
start = time.monotonic()
try:
    out = client.completions.create(model=model, prompt=json.loads(sys.argv[2]), max_tokens=int(sys.argv[3]),
                                    temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    answer = {"token_ids": out.model_dump()["choices"][0]["token_ids"]}
except openai.APIError as exc:
    answer = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps({**answer, "elapsed_s": time.monotonic() - start}), flush=True)
"""
# run in node 0: GET or POST one path of the front end, print the body
FRONT = """import sys, httpx
print(httpx.request(sys.argv[2], sys.argv[1] + sys.argv[3], timeout=60).text)
"""


class _Deployment:
    """Prefill in node 0, decode in node 1 (Ray), the driver and every client in node 0."""

    def __init__(self, tb):
        from disaggsdk.testbed.ray_cluster import ray_env
        from tests.testbed.test_deployment_across_nodes import LOG_DIR, SPEC_PATH, _wait_ready

        self.tb, self.log_dir = tb, LOG_DIR
        self.env = {**ray_env(), "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
        n0 = tb.node(0)
        n0.run(["sh", "-c", f"cat > {SPEC_PATH}"], input=_spec_yaml())
        self.launch = n0.popen(["sh", "-c", f'echo "$$"; exec "$0" -m disaggsdk.cli.main launch {SPEC_PATH} '
                                            f"--backend ray --address {tb.ray_address} --port 0 --no-live "
                                            f"--max-restarts 0 --log-dir {LOG_DIR}", sys.executable],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env)
        self.lines: list[str] = []
        assert self.launch.stdout is not None
        self.driver_pid = self.launch.stdout.readline().strip()
        self.url = _wait_ready(self.launch, self.lines)

    def ask(self, prompt: list[int], timeout_s: float = HANG_BOUND_S) -> dict:
        done = self.tb.node(0).run([sys.executable, "-c", ASK, self.url, json.dumps(prompt), str(MAX_TOKENS),
                                    str(timeout_s)], env=self.env, timeout_s=timeout_s + 30)
        return json.loads(done.stdout)

    def ask_later(self, prompt: list[int], timeout_s: float = HANG_BOUND_S) -> subprocess.Popen[str]:
        return self.tb.node(0).popen([sys.executable, "-c", ASK, self.url, json.dumps(prompt), str(MAX_TOKENS),
                                      str(timeout_s)], env=self.env)

    def front(self, method: str, path: str) -> str:
        return self.tb.node(0).run([sys.executable, "-c", FRONT, self.url, method, path], env=self.env).stdout

    def free_pages(self) -> dict[str, int]:
        """Each unit's free pages once its prefix cache let go of what it held."""
        return json.loads(self.front("POST", "/reset_prefix_cache"))["num_free_pages"]

    def log(self, unit: str) -> str:
        node = self.tb.node(0 if unit.startswith("prefill") else 1)
        return node.run(["cat", f"{self.log_dir}/{unit}.log"], check=False).stdout

    def stop(self) -> None:
        """SIGTERM to the driver in node 0; the launch ends on its own (killed if it does not in 60 s)."""
        try:
            if self.launch.poll() is None:
                self.tb.node(0).run(["kill", "-TERM", self.driver_pid], check=False)
            assert self.launch.stdout is not None
            self.lines += self.launch.stdout.readlines()  # to its end, also when it ended on its own
            self.launch.wait(60)
        finally:
            if self.launch.poll() is None:
                self.launch.kill()
                self.launch.wait(10)


def cut_while_kv_crosses(deployment: _Deployment, tb):
    """Slow the links, send the long prompt from node 0 and cut node 1's link once 1 MiB of its KV
    has crossed. Returns (the reshaped testbed, the client's process, when the link was cut); the
    client is killed if the cut never came."""
    tb = tb.set_link(SLOW_LINK)  # 8 MiB of KV take seconds: the cut lands mid-transfer
    rx_before = tb.node(1).link_counters().rx_bytes
    in_flight = deployment.ask_later(LONG_PROMPT)
    try:
        while tb.node(1).link_counters().rx_bytes - rx_before < (1 << 20):  # the KV is crossing
            assert in_flight.poll() is None, in_flight.communicate()
            time.sleep(0.05)
        cut_at = time.monotonic()
        cut_link(tb, 1)
    except BaseException:
        if in_flight.poll() is None:
            in_flight.kill()
            in_flight.wait(10)
        raise
    return tb, in_flight, cut_at


def _spec_yaml() -> str:
    import attrs

    from disaggsdk.spec import spec_to_yaml
    from tests.launch._helpers import make_spec

    spec = make_spec("qwen3-tiny", provider="tcp", num_pages=512, budget=256, page_size=16, deadline_s=DEADLINE_S)
    return spec_to_yaml(attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpus_per_node=1)))


def _deployment_testbed(testbed):
    pytest.importorskip("ray")
    pytest.importorskip("openai")
    pytest.importorskip("disaggsdk.transfer._fabric")
    from disaggsdk.testbed import RayOptions

    return testbed(nodes=2, link=FAST_LINK,
                   ray=RayOptions(num_cpus=1, resources={"disaggsdk_slot": 1}, object_store_bytes=80 << 20))


def _disaggsdk_shm_files(node) -> list[str]:
    # the KV pools and mirrors (disaggsdk-kv*) and libfabric shm endpoints ("<pid>:<ep>:<n>")
    listed = node.run(["ls", "-A", "/dev/shm"]).stdout.split()
    return [name for name in listed if name.startswith("disaggsdk") or name.split(":")[0].isdigit()]


def _after_stop_no_shm_left(tb) -> dict[str, list[str]]:
    # the units' processes end with the launch; give their exit a bounded while
    deadline = time.monotonic() + 30
    while True:
        left = {node.name: _disaggsdk_shm_files(node) for node in tb.nodes}
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _stopped_cleanly(deployment: _Deployment) -> bool:
    # the driver's SIGTERM ended it after a clean shutdown: status 143, which nsenter passes on as
    # the signal's number or dies of, by version (as in test_deployment_across_nodes)
    return deployment.launch.returncode in (128 + signal.SIGTERM, signal.SIGTERM, -signal.SIGTERM) and \
        "Traceback" not in "".join(deployment.lines)


def _report(**facts: object) -> None:
    # what the fault did, for the issue: `pytest -s` shows it, a failure's captured output holds it
    print("link-fault:", json.dumps(facts, default=str), flush=True)


@pytest.mark.slow
@needs_nft
def test_a_deployment_across_nodes_under_one_percent_loss_answers_the_unfaulted_tokens(testbed):
    tb = _deployment_testbed(testbed)
    deployment = _Deployment(tb)
    try:
        baseline_pages = deployment.free_pages()
        want = [deployment.ask(prompt)["token_ids"] for prompt in SHORT_PROMPTS]
        deployment.free_pages()  # decode's prefix cache forgets them: the faulted run transfers them again
        sent_before = _metric_value(deployment.front("GET", "/metrics"), "disaggsdk_kv_transfer_bytes_total",
                                    "prefill-0")
        drop_packets(tb, 1, 1.0)
        faulted = [deployment.ask(prompt) for prompt in SHORT_PROMPTS]
        drops = drop_counts(tb.node(1).namespace)[FAULT_TABLE] + \
            drop_counts(tb.switch_namespace)[f"{FAULT_TABLE}_{tb.node(1).switch_port}"]
        metrics = deployment.front("GET", "/metrics")
        heal_link(tb, 1)
        pages_after = deployment.free_pages()
        grants_open = grant_keys_open_once_settled(deployment)
    finally:
        deployment.stop()
    _report(case="1% loss", elapsed_s=[a.get("elapsed_s") for a in faulted], dropped_packets=drops,
            errors=[a["error"] for a in faulted if "error" in a], launch_rc=deployment.launch.returncode)
    assert [a.get("token_ids") for a in faulted] == want, faulted
    assert _metric_value(metrics, "disaggsdk_kv_transfer_bytes_total", "prefill-0") > sent_before  # KV crossed
    assert drops > 0
    assert pages_after == baseline_pages and grants_open == 0
    assert _after_stop_no_shm_left(tb) == {node.name: [] for node in tb.nodes}
    assert _stopped_cleanly(deployment), "".join(deployment.lines)


@pytest.mark.slow
def test_a_link_cut_while_kv_is_in_flight_ends_the_request_within_its_deadline_and_service_resumes(testbed):
    """Node 1's link (decode's, and its Ray node's) is cut for 3 s while a long prompt's KV crosses
    it: the request completes (retried, prefilled locally) or fails with a clear error, never hangs;
    after the heal new requests get the unfaulted tokens; no page or shm file is left."""
    tb = _deployment_testbed(testbed)
    deployment = _Deployment(tb)
    try:
        baseline_pages = deployment.free_pages()
        want_long = deployment.ask(LONG_PROMPT)["token_ids"]
        want_short = deployment.ask(SHORT_PROMPTS[0])["token_ids"]
        deployment.free_pages()
        tb, in_flight, cut_at = cut_while_kv_crosses(deployment, tb)
        try:
            time.sleep(3.0)
            heal_link(tb, 1)
            healed_at = time.monotonic()
            out, _ = in_flight.communicate(timeout=HANG_BOUND_S + 30)
        finally:
            if in_flight.poll() is None:
                in_flight.kill()
                in_flight.wait(10)
        ended_after_cut_s = time.monotonic() - cut_at
        outcome = json.loads(out)
        tb = tb.set_link(FAST_LINK)
        after_heal = [deployment.ask(SHORT_PROMPTS[0]), deployment.ask(LONG_PROMPT)]
        metrics = deployment.front("GET", "/metrics")
        health = json.loads(deployment.front("GET", "/health"))
        pages_after = deployment.free_pages()
        grants_open = grant_keys_open_once_settled(deployment)
        decode_log = deployment.log("decode-0")
        prefill_log = deployment.log("prefill-0")
    finally:
        deployment.stop()
    counters = {name: {engine: _metric_value(metrics, name, engine, missing=-1.0)
                       for engine in ("prefill-0", "decode-0")}
                for name in ("disaggsdk_kv_transfer_failures_total", "disaggsdk_requests_retried_total",
                             "disaggsdk_requests_prefilled_locally_total")}
    _report(case="cut 3 s mid-transfer", in_flight=outcome, ended_after_cut_s=ended_after_cut_s,
            healed_after_cut_s=healed_at - cut_at, after_heal_elapsed_s=[a.get("elapsed_s") for a in after_heal],
            after_heal_errors=[a["error"] for a in after_heal if "error" in a], counters=counters, health=health,
            decode_log_tail=decode_log[-3000:], prefill_log_tail=prefill_log[-1500:],
            launch_rc=deployment.launch.returncode, launch_said=[line for line in deployment.lines if "unit " in line])
    # the in-flight request ended (answered or refused) well before the hang bound
    assert outcome["elapsed_s"] < HANG_BOUND_S, outcome
    if "error" in outcome:
        assert len(outcome["error"]) > 20, outcome  # a message, not a bare status
    else:
        assert outcome["token_ids"] == want_long, outcome
    assert [a.get("token_ids") for a in after_heal] == [want_short, want_long], after_heal
    assert health["status"] == "ok", health
    # nothing left in any engine's batch or queue, and every page back in the pools
    for gauge in ("disaggsdk_num_requests_running", "disaggsdk_num_requests_waiting"):
        assert [_metric_value(metrics, gauge, engine) for engine in ("prefill-0", "decode-0")] == [0, 0], gauge
    assert pages_after == baseline_pages and grants_open == 0  # no grant of the cut transfer stays open
    assert _after_stop_no_shm_left(tb) == {node.name: [] for node in tb.nodes}
    assert _stopped_cleanly(deployment), "".join(deployment.lines)


@pytest.mark.slow
def test_a_deployment_across_nodes_under_50ms_jitter_answers_the_unfaulted_tokens(testbed):
    probe = testbed(nodes=1)
    if not netem_available(probe.switch_namespace) and not packet_delay.iptables_available():
        pytest.skip("no sch_netem on this kernel and no iptables for the user-space delayer: apt-get install iptables")
    tb = _deployment_testbed(testbed)
    deployment = _Deployment(tb)
    try:
        baseline_pages = deployment.free_pages()
        want = [deployment.ask(prompt)["token_ids"] for prompt in SHORT_PROMPTS]
        deployment.free_pages()
        sent_before = _metric_value(deployment.front("GET", "/metrics"), "disaggsdk_kv_transfer_bytes_total",
                                    "prefill-0")
        add_jitter(tb, 1, 50)
        faulted = [deployment.ask(prompt) for prompt in SHORT_PROMPTS]
        sent_after = _metric_value(deployment.front("GET", "/metrics"), "disaggsdk_kv_transfer_bytes_total",
                                   "prefill-0")
        heal_link(tb, 1)
        pages_after = deployment.free_pages()
        grants_open = grant_keys_open_once_settled(deployment)
    finally:
        deployment.stop()
    _report(case="50 ms jitter", elapsed_s=[a.get("elapsed_s") for a in faulted])
    assert [a.get("token_ids") for a in faulted] == want, faulted
    assert sent_after > sent_before  # the KV crossed the jittered link
    assert pages_after == baseline_pages and grants_open == 0
    assert _after_stop_no_shm_left(tb) == {node.name: [] for node in tb.nodes}


def grant_keys_open_once_settled(deployment: _Deployment, within_s: float = 30.0) -> float:
    """decode-0's `disaggsdk_kv_grant_keys_open` once it is 0, or after ``within_s``: a failed
    attempt's keys stay open until no write of it can land (the quarantine's drain)."""
    deadline = time.monotonic() + within_s
    while True:
        grants = _metric_value(deployment.front("GET", "/metrics"), "disaggsdk_kv_grant_keys_open", "decode-0")
        if grants == 0 or time.monotonic() > deadline:
            return grants
        time.sleep(0.5)


def _metric_value(text: str, name: str, engine: str, missing: float | None = None) -> float:
    import re

    found = re.search(rf'^{name}{{[^}}]*engine="{engine}"[^}}]*}} (\S+)$', text, re.M)
    if found is None:
        if missing is not None:
            return missing
        raise AssertionError(f"no {name} for {engine} in /metrics")
    return float(found.group(1))
