"""A testbed's lifecycle: `up` builds it, `status` reads its links' counters, `down` removes it;
the state file between them lets each run in a different process (the CLI's three commands).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType

from disaggsdk.testbed.errors import TestbedError
from disaggsdk.testbed.link import LinkSpec, netem_shapes, shape_link
from disaggsdk.testbed.link_faults import link_delay_record, require_nftables, set_link_delay, set_link_loss
from disaggsdk.testbed.naming import (
    BRIDGE,
    DEFAULT_NAME,
    MAX_NODES,
    NODE_INTERFACE,
    STATE_DIR,
    SUBNET_PREFIX_LEN,
    check_name,
    namespace_prefix,
    node_address,
    node_name,
    node_namespace,
    state_path,
    switch_namespace,
    switch_port,
)
from disaggsdk.testbed.node import LinkCounters, Node, host_paths_under_tmp, start_anchor, stop_anchor, wait_gone
from disaggsdk.testbed.packet_delay import records_of, stop_delayers
from disaggsdk.testbed.ray_cluster import RayOptions, start_ray, stop_ray
from disaggsdk.testbed.state import NodeStatusState, StateFile
from disaggsdk.testbed.tools import require_tools, run_tool, try_tool

STATE_VERSION = 1
PROCESS_EXIT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Testbed:
    """A testbed that is up (or being built): what its state file records.

    Use it as a context manager to take it down on leaving the block, whatever happens in it.

    Attributes:
        name: the testbed's name (the prefix of its namespaces, hostnames and state file).
        link: what each node's link offers.
        switch_namespace: the namespace of the bridge.
        nodes: the nodes built so far, in index order.
        ray_address: ``ADDRESS:PORT`` of the Ray head in node 0, None without Ray.
        complete: False while `up` is still building it.
        state_file: where it is recorded.
    """

    __test__ = False  # a class named Test* is not a pytest test class

    name: str
    link: LinkSpec
    switch_namespace: str
    nodes: tuple[Node, ...]
    ray_address: str | None
    complete: bool
    state_file: Path

    def node(self, index: int) -> Node:
        """Node ``index``."""
        return self.nodes[index]

    def to_dict(self) -> StateFile:
        """The testbed as JSON values: the state file and ``testbed up --json``."""
        return {"version": STATE_VERSION, "name": self.name, "link": self.link.to_dict(),
                "switch_namespace": self.switch_namespace, "nodes": [node.to_dict() for node in self.nodes],
                "ray_address": self.ray_address, "complete": self.complete, "state_file": str(self.state_file)}

    @classmethod
    def from_dict(cls, data: StateFile, state_file: Path) -> Testbed:
        """The inverse of `to_dict`.

        Raises:
            TestbedError: a file of another version.
        """
        if data.get("version") != STATE_VERSION:
            raise TestbedError(f"{state_file}: state version {data.get('version')!r}, this disaggsdk reads "
                               f"{STATE_VERSION}; take the testbed down with the disaggsdk that built it")
        return cls(name=str(data["name"]), link=LinkSpec.from_dict(data["link"]),
                   switch_namespace=str(data["switch_namespace"]),
                   nodes=tuple(Node.from_dict(node) for node in data["nodes"]),
                   ray_address=None if data.get("ray_address") is None else str(data["ray_address"]),
                   complete=bool(data["complete"]), state_file=state_file)

    def set_link(self, link: LinkSpec) -> Testbed:
        """Reshape every node's link to ``link`` while the testbed runs (a benchmark's rate sweep)
        and record it; returns the testbed as it now is.

        Raises:
            NetemUnavailable: ``link`` has delay, the kernel no sch_netem and ``iptables`` is missing.
            PacketDropUnavailable: ``link`` has loss, the kernel no sch_netem and ``nft`` is missing.
            TestbedError: a ``tc``, ``nft`` or ``iptables`` command failed.
        """
        netem = _check_link(link, self.switch_namespace)
        for node in self.nodes:
            _shape(link, node.namespace, node.interface, self.switch_namespace, node.switch_port, netem,
                   link_delay_record(self.state_file.parent, node.name), fresh=False)
        changed = replace(self, link=link)
        _write_state(changed)
        return changed

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        down(self.name, self.state_file.parent)


@dataclass(frozen=True)
class NodeStatus:
    """One node as `status` finds it."""

    name: str
    address: str
    namespace: str
    alive: bool  # its anchor still runs
    rx_bytes: int  # received over its link
    tx_bytes: int  # sent over its link

    def to_dict(self) -> NodeStatusState:
        """The fields as JSON values."""
        return {"name": self.name, "address": self.address, "namespace": self.namespace, "alive": self.alive,
                "rx_bytes": self.rx_bytes, "tx_bytes": self.tx_bytes}


def up(nodes: int, link: LinkSpec, name: str = DEFAULT_NAME, ray: RayOptions | None = None,
       state_dir: Path = STATE_DIR) -> Testbed:
    """Build a testbed of ``nodes`` nodes, each linked to one switch by ``link``.

    Args:
        nodes: how many nodes, 1 to `naming.MAX_NODES`.
        link: every node's link (rate; delay sch_netem or iptables, loss sch_netem or nftables).
        name: the testbed's name; several testbeds of different names can be up at once.
        ray: start a Ray node in each node with these options; None: no Ray.
        state_dir: where the state file goes.

    Returns:
        the testbed, complete and recorded.

    Raises:
        TestbedUnavailable: not root, or iproute2/util-linux missing.
        NetemUnavailable: ``link`` has delay, the kernel no sch_netem and ``iptables`` is missing.
        PacketDropUnavailable: ``link`` has loss, the kernel no sch_netem and ``nft`` is missing.
        TestbedError: bad arguments, a testbed of that name is up already, or a step failed. On
            any failure everything built so far is torn down first.
    """
    try:
        check_name(name)
    except ValueError as exc:
        raise TestbedError(str(exc)) from None
    if not 1 <= nodes <= MAX_NODES:
        raise TestbedError(f"--nodes {nodes}: give 1 to {MAX_NODES}")
    require_tools()
    path = state_path(name, state_dir)
    if path.exists() or _namespaces(name):
        raise TestbedError(f"testbed {name!r} is up already (or half-built): "
                           f"take it down with `disaggsdk testbed down --name {name}` first")
    testbed = Testbed(name=name, link=link, switch_namespace=switch_namespace(name), nodes=(), ray_address=None,
                      complete=False, state_file=path)
    try:
        _write_state(testbed)
        _make_switch(testbed.switch_namespace)
        netem = _check_link(link, testbed.switch_namespace)
        for index in range(nodes):
            testbed = replace(testbed, nodes=(*testbed.nodes, _make_node(name, index, link, netem, state_dir)))
            _write_state(testbed)
        if ray is not None:
            testbed = replace(testbed, ray_address=start_ray(testbed.nodes, ray))
        testbed = replace(testbed, complete=True)
        _write_state(testbed)
    except BaseException:
        down(name, state_dir)
        raise
    return testbed


def load(name: str = DEFAULT_NAME, state_dir: Path = STATE_DIR) -> Testbed:
    """The testbed ``name`` as its state file records it.

    Raises:
        TestbedError: no such testbed is up, or its file cannot be read.
    """
    try:
        check_name(name)
    except ValueError as exc:
        raise TestbedError(str(exc)) from None
    path = state_path(name, state_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TestbedError(f"no testbed named {name!r} is up ({path} does not exist); "
                           f"start one with `disaggsdk testbed up --name {name}`") from None
    except (OSError, ValueError) as exc:
        raise TestbedError(f"{path}: cannot read the testbed's state ({exc}); "
                           f"`disaggsdk testbed down --name {name}` removes what is left") from None
    return Testbed.from_dict(data, path)


def status(name: str = DEFAULT_NAME, state_dir: Path = STATE_DIR) -> tuple[Testbed, tuple[NodeStatus, ...]]:
    """The testbed ``name`` and, per node, whether it runs and the bytes its link carried.

    Raises:
        TestbedError: no such testbed is up.
        TestbedUnavailable: not root, or iproute2 missing.
    """
    require_tools()
    testbed = load(name, state_dir)
    found = []
    for node in testbed.nodes:
        try:
            counters = node.link_counters()
        except TestbedError:
            counters = LinkCounters(rx_bytes=0, tx_bytes=0)  # the namespace is gone: the node is down
        found.append(NodeStatus(name=node.name, address=node.address, namespace=node.namespace,
                                alive=node.is_alive(), rx_bytes=counters.rx_bytes, tx_bytes=counters.tx_bytes))
    return testbed, tuple(found)


def down(name: str = DEFAULT_NAME, state_dir: Path = STATE_DIR) -> bool:
    """Take testbed ``name`` down: stop Ray in its nodes and their links' packet delayers, kill
    every process in its namespaces, delete the namespaces (their veths and bridge go with them),
    the state file and the delayers' records. Safe to call again, and on a half-built testbed.

    Returns:
        whether there was anything to remove.

    Raises:
        TestbedUnavailable: not root, or iproute2 missing.
        TestbedError: a namespace could not be deleted (the message names it).
    """
    try:
        check_name(name)
    except ValueError as exc:
        raise TestbedError(str(exc)) from None
    require_tools()
    path = state_path(name, state_dir)
    try:
        recorded: Testbed | None = load(name, state_dir)
    except TestbedError:
        recorded = None  # no file or an unreadable one: the namespaces' prefix finds what is left
    nodes = recorded.nodes if recorded is not None else ()
    if recorded is not None and recorded.ray_address is not None:
        stop_ray(nodes)
    for record in records_of(state_dir, name):
        stop_delayers(record, remove_rules=False)  # their rules go with the namespaces below
    for node in nodes:
        stop_anchor(node)
    namespaces = _namespaces(name)
    for namespace in namespaces:
        _kill_processes_in(namespace)
        try_tool(["ip", "netns", "del", namespace])
    left = _namespaces(name)
    if left:
        raise TestbedError(f"testbed {name!r}: namespaces {', '.join(left)} could not be deleted; "
                           f"`ip netns pids NS` shows what holds them")
    existed = path.exists() or bool(namespaces)
    path.unlink(missing_ok=True)
    return existed


def _write_state(testbed: Testbed) -> None:
    # written whole and renamed: a reader never sees half a file
    testbed.state_file.parent.mkdir(parents=True, exist_ok=True)
    partial = testbed.state_file.with_suffix(".json.partial")
    partial.write_text(json.dumps(testbed.to_dict(), indent=2) + "\n", encoding="utf-8")
    os.replace(partial, testbed.state_file)


def _make_switch(namespace: str) -> None:
    run_tool(["ip", "netns", "add", namespace])
    _quiet_ipv6(namespace)
    run_tool(["ip", "-n", namespace, "link", "add", BRIDGE, "type", "bridge"])
    run_tool(["ip", "-n", namespace, "link", "set", BRIDGE, "up"])


def _check_link(link: LinkSpec, namespace: str) -> bool:
    # whether netem shapes the link; without it a loss is dropped by nftables, which must be here
    netem = netem_shapes(link, namespace)
    if link.loss_pct and not netem:
        require_nftables(f"--link {link.describe()}: the loss, on a kernel without sch_netem,")
    return netem


def _shape(link: LinkSpec, namespace: str, interface: str, sw: str, port: str, netem: bool, delayer_record: Path,
           fresh: bool) -> None:
    # a fresh node has no loss table or delayer to remove: it runs `nft` only where it drops, a
    # delayer only where it delays
    shape_link(link, namespace, interface, sw, port, netem)
    loss_pct = 0.0 if netem else link.loss_pct
    if loss_pct or not fresh:
        set_link_loss(namespace, interface, loss_pct)
    delay_ms = 0.0 if netem else link.delay_ms
    if delay_ms or not fresh:
        set_link_delay(replace(link, delay_ms=delay_ms), namespace, interface, delayer_record)


def paths_nodes_run_from() -> tuple[str, ...]:
    """The host folders a node's commands need as the host has them: the working directory (the
    checkout a command runs in), this Python's environment and its base, the package's own folder
    (an editable checkout, or site-packages) and HOME (Ray's token, caches)."""
    package_parent = Path(__file__).resolve().parents[2]
    return (os.getcwd(), sys.prefix, sys.base_prefix, str(package_parent), os.path.expanduser("~"))


def _make_node(name: str, index: int, link: LinkSpec, netem: bool, state_dir: Path) -> Node:
    namespace, port, address = node_namespace(name, index), switch_port(index), node_address(index)
    sw = switch_namespace(name)
    run_tool(["ip", "netns", "add", namespace])
    _quiet_ipv6(namespace)
    # both ends are made inside the testbed's namespaces: the host's namespace never holds either
    run_tool(["ip", "-n", namespace, "link", "add", NODE_INTERFACE, "type", "veth", "peer", "name", port, "netns", sw])
    run_tool(["ip", "-n", sw, "link", "set", port, "master", BRIDGE])
    run_tool(["ip", "-n", sw, "link", "set", port, "up"])
    run_tool(["ip", "-n", namespace, "addr", "add", f"{address}/{SUBNET_PREFIX_LEN}", "dev", NODE_INTERFACE])
    run_tool(["ip", "-n", namespace, "link", "set", "lo", "up"])
    run_tool(["ip", "-n", namespace, "link", "set", NODE_INTERFACE, "up"])
    node = node_name(name, index)
    _shape(link, namespace, NODE_INTERFACE, sw, port, netem, link_delay_record(state_dir, node), fresh=True)
    anchor_pid, unshare_pid = start_anchor(node, namespace, host_paths_under_tmp(paths_nodes_run_from()))
    return Node(name=node, index=index, address=address, namespace=namespace, interface=NODE_INTERFACE,
                switch_port=port, anchor_pid=anchor_pid, unshare_pid=unshare_pid)


def _quiet_ipv6(namespace: str) -> None:
    # the testbed speaks IPv4 only: without IPv6 no router solicitations or neighbour discovery
    # add bytes to the links' counters that no test sent
    # (a kernel without IPv6 has nothing to quiet: a failure here is no failure of the testbed)
    try_tool(["ip", "netns", "exec", namespace, "sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
              "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"])


def _namespaces(name: str) -> list[str]:
    listed = run_tool(["ip", "-j", "netns", "list"]).strip()
    prefix = namespace_prefix(name)
    return sorted(entry["name"] for entry in (json.loads(listed) if listed else []) if entry["name"].startswith(prefix))


def _kill_processes_in(namespace: str) -> None:
    # what is left in a namespace of the testbed after the anchors died: processes run there with
    # `ip netns exec` rather than in a node, or a half-built node's anchor not yet recorded
    listed = run_tool(["ip", "netns", "pids", namespace]).split()
    pids = [int(pid) for pid in listed if pid.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_gone(pids, PROCESS_EXIT_TIMEOUT_S)
