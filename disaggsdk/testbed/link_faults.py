"""Faults on a running testbed's links: a link cut and healed, a share of packets dropped, jitter."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from disaggsdk.testbed.errors import NetemUnavailable, PacketDropUnavailable, TestbedError
from disaggsdk.testbed.link import LinkSpec, delay_queue_packets, netem_args, netem_available, shape_link, tbf_args
from disaggsdk.testbed.packet_delay import iptables_available, record_path, start_delayers, stop_delayers
from disaggsdk.testbed.tools import COMMAND_TIMEOUT_S, run_tool

if TYPE_CHECKING:
    from disaggsdk.testbed.testbed import Testbed

FAULT_TABLE = "disaggsdk_fault"  # a fault's drop (per namespace; in the switch's, one per port)
LINK_LOSS_TABLE = "disaggsdk_link_loss"  # the link's own loss where the kernel has no sch_netem
# a qdisc a fault put at the root carries this handle (the link's own carry 1:), so `heal_link`
# knows to reshape the link and leaves it alone otherwise (a reshape drops what is queued)
FAULT_QDISC_HANDLE = "a:"
_NUMGEN_MOD = 10000  # drop shares resolve to 0.01%
# a veth passes a TCP sender's 64 KiB GSO super-packets whole, and a drop (nft's or netem's) loses
# one such skb of up to 45 frames at once: where packets are dropped, both ends of the link hand
# the veth one frame at a time (the kernel segments at their egress), so 1% is 1% of the frames
# a wire would carry; the heal gives the veth's own limit back
GSO_MAX_SEGS_VETH = 65535
_INSTALL_NFT = "install nftables (apt-get install nftables)"
# the user-space delayer's NFQUEUE numbers (per namespace): the link's own delay is queue
# LINK_DELAY_QUEUE_NUM on every node's ingress, a jitter on node K's packets queue
# JITTER_QUEUE_BASE + K on every other node's ingress, ahead of it
LINK_DELAY_QUEUE_NUM = 1
JITTER_QUEUE_BASE = 100


def nftables_available() -> bool:
    """Whether the ``nft`` command is here (the kernel's nf_tables with numgen is assumed, as
    every distribution kernel has it; a kernel without fails the first `drop_packets`)."""
    return shutil.which("nft") is not None


def cut_link(testbed: Testbed, index: int) -> None:
    """Cut node ``index``'s link: the switch's port to it goes down (see the module's docstring).

    Raises:
        IndexError: no such node.
        TestbedError: the ``ip`` command failed.
    """
    node = testbed.nodes[index]
    run_tool(["ip", "-n", testbed.switch_namespace, "link", "set", node.switch_port, "down"])


def link_is_cut(testbed: Testbed, index: int) -> bool:
    """Whether node ``index``'s link is cut (the switch's port to it is down).

    Raises:
        TestbedError: the port is gone (the testbed is down).
    """
    node = testbed.nodes[index]
    shown = json.loads(run_tool(["ip", "-n", testbed.switch_namespace, "-j", "link", "show", "dev",
                                 node.switch_port]))
    return "UP" not in shown[0]["flags"]


def drop_packets(testbed: Testbed, index: int, loss_pct: float) -> None:
    """Lose ``loss_pct`` percent of the packets crossing node ``index``'s link, each way, on top of
    what the link's own loss drops; in place of an earlier `drop_packets` on that link.

    Raises:
        ValueError: ``loss_pct`` not in (0, 100].
        PacketDropUnavailable: neither ``nft`` nor sch_netem is here (the message says what to install).
        TestbedError: an ``nft`` or ``tc`` command failed.
    """
    if not 0 < loss_pct <= 100:
        raise ValueError(f"loss {loss_pct}%: give more than 0% and at most 100%")
    node = testbed.nodes[index]
    by_nft = nftables_available()
    if not by_nft and not netem_available(testbed.switch_namespace):
        raise PacketDropUnavailable(
            f"dropping {loss_pct:g}% of node {node.name}'s packets needs nftables or the kernel's sch_netem, "
            f"and this machine has neither: {_INSTALL_NFT}")
    _set_gso_max_segs(node.namespace, node.interface, 1)
    _set_gso_max_segs(testbed.switch_namespace, node.switch_port, 1)
    if by_nft:
        _set_ingress_drop(node.namespace, FAULT_TABLE, node.interface, loss_pct)
        _set_ingress_drop(testbed.switch_namespace, _port_table(node.switch_port), node.switch_port, loss_pct)
        return
    # on the node's egress the fault's netem takes the place of the link's own: it keeps its delay,
    # and its loss joins the fault's
    link = testbed.link
    node_loss_pct = 100 * (1 - (1 - link.loss_pct / 100) * (1 - loss_pct / 100))
    own_delay = ["delay", f"{link.delay_ms:g}ms"] if link.delay_ms else []
    _put_fault_netem(node.namespace, node.interface, link, [*own_delay, "loss", f"{node_loss_pct:g}%"])
    _put_fault_netem(testbed.switch_namespace, node.switch_port, testbed.link, ["loss", f"{loss_pct:g}%"])


def add_jitter(testbed: Testbed, index: int, jitter_ms: float) -> None:
    """Vary the delay of what node ``index`` sends by ``jitter_ms`` either way around
    ``max(link delay, jitter_ms)``, uniformly and per packet (packets may overtake each other, as
    on a real path); in place of an earlier `add_jitter` on that link. netem does it where the
    kernel has sch_netem, the user-space delayer (`packet_delay`) elsewhere.

    Raises:
        ValueError: ``jitter_ms`` not positive.
        NetemUnavailable: the kernel has no sch_netem and ``iptables``, which feeds the delayer, is
            missing (the message says what to install).
        TestbedError: a ``tc`` or ``iptables`` command failed, or the delayer did not start.
    """
    if not jitter_ms > 0:
        raise ValueError(f"jitter {jitter_ms} ms: give more than 0")
    node = testbed.nodes[index]
    delay_ms = max(testbed.link.delay_ms, jitter_ms)
    if not netem_available(testbed.switch_namespace):
        if not iptables_available():
            raise NetemUnavailable(
                f"jitter of {jitter_ms:g} ms on node {node.name}'s link: this kernel has no sch_netem qdisc, and "
                "the user-space delayer that stands in for it queues packets with iptables' NFQUEUE, but the "
                "`iptables` command is missing: install iptables (apt-get install iptables), or use a kernel "
                "with sch_netem (CONFIG_NET_SCH_NETEM, modprobe sch_netem)")
        holders = [(other.namespace, other.interface) for other in testbed.nodes if other.index != index]
        start_delayers(holders, node.address, JITTER_QUEUE_BASE + index, delay_ms, jitter_ms,
                       delay_queue_packets(testbed.link, delay_ms + jitter_ms),
                       jitter_record(testbed, index))
        return
    options = ["delay", f"{delay_ms:g}ms", f"{jitter_ms:g}ms"]
    if testbed.link.loss_pct:
        options += ["loss", f"{testbed.link.loss_pct:g}%"]
    _put_fault_netem(node.namespace, node.interface, testbed.link, options)


def heal_link(testbed: Testbed, index: int) -> None:
    """Remove every fault of node ``index``'s link: the port comes up, the drop tables go, a
    jitter's delayer stops (its rules go first) and a link a netem fault reshaped gets its own
    shaping back (the testbed's `LinkSpec`). Safe to call on a link without faults.

    Raises:
        TestbedError: a command failed.
    """
    node = testbed.nodes[index]
    stop_delayers(jitter_record(testbed, index))
    run_tool(["ip", "-n", testbed.switch_namespace, "link", "set", node.switch_port, "up"])
    # a node that tried to reach the cut one meanwhile holds a neighbour entry still resolving
    # (INCOMPLETE) or given up (FAILED) for it; one that fails just after the heal makes the kernel
    # answer "No route to host" for about a second (seen in 2 of 4 runs of test_link_faults). Forget
    # the learnt entries now that the port is up: the first packet after the heal resolves afresh
    for other in testbed.nodes:
        run_tool(["ip", "-n", other.namespace, "neigh", "flush", "dev", other.interface])
    link_loss_by_nft = False
    if nftables_available():
        _remove_table(node.namespace, FAULT_TABLE)
        _remove_table(testbed.switch_namespace, _port_table(node.switch_port))
        link_loss_by_nft = LINK_LOSS_TABLE in _tables(node.namespace)
    _set_gso_max_segs(node.namespace, node.interface, 1 if link_loss_by_nft else GSO_MAX_SEGS_VETH)
    _set_gso_max_segs(testbed.switch_namespace, node.switch_port, GSO_MAX_SEGS_VETH)
    ends = ((node.namespace, node.interface), (testbed.switch_namespace, node.switch_port))
    if any(_root_handle(namespace, device) == FAULT_QDISC_HANDLE for namespace, device in ends):
        # only netem puts a fault's qdisc there: this kernel has it
        shape_link(testbed.link, node.namespace, node.interface, testbed.switch_namespace, node.switch_port,
                   netem=True)


def jitter_record(testbed: Testbed, index: int) -> Path:
    """Where the user-space delayers of a jitter on node ``index``'s packets are recorded."""
    return record_path(testbed.state_file.parent, testbed.nodes[index].name, "jitter")


def set_link_delay(link: LinkSpec, namespace: str, interface: str, record: Path) -> None:
    """The link's own delay where the kernel has no sch_netem: hold every packet ``interface``
    receives for ``link.delay_ms`` in the user-space delayer (on each node's ingress, so met once
    between two nodes, as netem's on each egress); no delay stops it. In place of the delayer
    ``record`` names.

    Raises:
        TestbedError: ``iptables`` is missing, or the delayer did not start.
    """
    if link.delay_ms > 0:
        start_delayers([(namespace, interface)], None, LINK_DELAY_QUEUE_NUM, link.delay_ms, 0.0,
                       delay_queue_packets(link, link.delay_ms), record)
    else:
        stop_delayers(record)


def link_delay_record(state_dir: Path, node_name: str) -> Path:
    """Where the user-space delayer of node ``node_name``'s link delay is recorded."""
    return record_path(state_dir, node_name, "link")


def set_link_loss(namespace: str, interface: str, loss_pct: float) -> None:
    """The link's own loss where the kernel has no sch_netem: drop ``loss_pct`` percent of what
    ``interface`` receives (nftables, on the node's ingress; see `link.shape_link`); 0 removes it.

    Raises:
        PacketDropUnavailable: ``loss_pct`` > 0 and ``nft`` missing.
        TestbedError: an ``nft`` command failed.
    """
    if loss_pct > 0:
        require_nftables(f"a link loss of {loss_pct:g}% without sch_netem")
        _set_ingress_drop(namespace, LINK_LOSS_TABLE, interface, loss_pct)
        # every node sends one frame at a time (see GSO_MAX_SEGS_VETH): what each receives is frames
        _set_gso_max_segs(namespace, interface, 1)
    elif nftables_available() and LINK_LOSS_TABLE in _tables(namespace):
        _remove_table(namespace, LINK_LOSS_TABLE)
        _set_gso_max_segs(namespace, interface, GSO_MAX_SEGS_VETH)


def require_nftables(what: str) -> None:
    """Check that ``nft`` is here for ``what`` (words for the message).

    Raises:
        PacketDropUnavailable: it is not; the message says what to install.
    """
    if not nftables_available():
        raise PacketDropUnavailable(f"{what} takes nftables, and the `nft` command is missing: {_INSTALL_NFT}, "
                                    "or use a kernel with sch_netem")


def drop_counts(namespace: str) -> dict[str, int]:
    """Packets each drop table of ``namespace`` has dropped so far, by table name (empty: none)."""
    listed = json.loads(run_tool(["ip", "netns", "exec", namespace, "nft", "-j", "list", "ruleset"]))
    counts: dict[str, int] = {}
    for entry in listed["nftables"]:
        rule = entry.get("rule")
        if rule is None or rule["family"] != "netdev":
            continue
        for expr in rule["expr"]:
            if "counter" in expr:
                counts[rule["table"]] = counts.get(rule["table"], 0) + int(expr["counter"]["packets"])
    return counts


def _tables(namespace: str) -> list[str]:
    listed = json.loads(run_tool(["ip", "netns", "exec", namespace, "nft", "-j", "list", "tables"]))
    return [entry["table"]["name"] for entry in listed["nftables"] if "table" in entry]


def _set_gso_max_segs(namespace: str, device: str, segments: int) -> None:
    run_tool(["ip", "-n", namespace, "link", "set", "dev", device, "gso_max_segs", str(segments)])


def _port_table(switch_port: str) -> str:
    return f"{FAULT_TABLE}_{switch_port}"  # the switch's namespace holds every node's port


def _set_ingress_drop(namespace: str, table: str, device: str, loss_pct: float) -> None:
    threshold = round(loss_pct / 100 * _NUMGEN_MOD)
    # declared, deleted and made again in one transaction: replaces an earlier drop atomically
    script = (f"table netdev {table} {{}}\n"
              f"delete table netdev {table}\n"
              f"table netdev {table} {{\n"
              f"  chain lose {{ type filter hook ingress device \"{device}\" priority 0; policy accept;\n"
              f"    numgen random mod {_NUMGEN_MOD} < {threshold} counter drop\n"
              "  }\n"
              "}\n")
    _nft(namespace, ["-f", "-"], script)


def _remove_table(namespace: str, table: str) -> None:
    # `delete` of a table that is not there fails; declaring it first makes the delete always apply
    _nft(namespace, ["-f", "-"], f"table netdev {table} {{}}\ndelete table netdev {table}\n")


def _nft(namespace: str, args: list[str], script: str) -> None:
    # the script goes on stdin, which run_tool does not take
    argv = ["ip", "netns", "exec", namespace, "nft", *args]
    try:
        done = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"`{' '.join(argv)}` ran past {COMMAND_TIMEOUT_S:g} s") from exc
    if done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}\n{script}")


def _put_fault_netem(namespace: str, device: str, link: LinkSpec, options: list[str]) -> None:
    limit = netem_args(link)[1:3]  # "limit N": a delay's worth of packets at line rate
    tc = ["tc", "-n", namespace, "qdisc", "replace", "dev", device]
    run_tool([*tc, "root", "handle", FAULT_QDISC_HANDLE, "netem", *limit, *options])
    run_tool([*tc, "parent", FAULT_QDISC_HANDLE, "handle", "2:", *tbf_args(link)])


def _root_handle(namespace: str, device: str) -> str | None:
    shown = json.loads(run_tool(["tc", "-n", namespace, "-j", "qdisc", "show", "dev", device]) or "[]")
    return next((str(q.get("handle")) for q in shown if q.get("root")), None)

