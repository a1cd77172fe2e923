"""Plan nodes onto Ray nodes (pure: `ray.nodes()` entries made here): Ray's order by default, a
node offering ``disaggsdk_node_K`` pinned to plan node K, and what a unit's KV endpoint listens on."""

from __future__ import annotations

import attrs
import msgspec
import pytest

from disaggsdk.launch import LaunchError
from disaggsdk.launch import messages as ch
from disaggsdk.launch.launcher.ray_launcher import RayLauncher
from disaggsdk.launch.launcher.ray_nodes import SLOT_RESOURCE, RayNode, map_plan_nodes, pin_resource
from disaggsdk.plan import make_plan
from tests.launch._helpers import make_spec


def two_node_plan():
    """Prefill on plan node 0, decode on plan node 1 (one rank a node)."""
    spec = make_spec("qwen3-tiny", provider="tcp")
    return make_plan(attrs.evolve(spec, hardware=attrs.evolve(spec.hardware, gpus_per_node=1)))


def ray_node(node_id: str, address: str, **resources: float) -> dict[str, object]:
    return {"NodeID": node_id, "NodeManagerAddress": address, "Alive": True, "Resources": resources}


def test_plan_nodes_take_ray_nodes_in_rays_order_without_pins():
    nodes = [ray_node("a" * 16, "10.0.0.1", disaggsdk_slot=1), ray_node("b" * 16, "10.0.0.2", disaggsdk_slot=1)]
    mapping = map_plan_nodes(two_node_plan(), nodes, SLOT_RESOURCE)  # type: ignore[arg-type]
    assert {k: n.address for k, n in mapping.items()} == {0: "10.0.0.1", 1: "10.0.0.2"}


def test_a_pinned_ray_node_takes_its_plan_node_whatever_rays_order():
    nodes = [ray_node("b" * 16, "198.18.0.11", disaggsdk_slot=1, **{pin_resource(1): 1}),
             ray_node("c" * 16, "198.18.0.12", disaggsdk_slot=1),
             ray_node("a" * 16, "198.18.0.10", disaggsdk_slot=1, **{pin_resource(0): 1})]
    mapping = map_plan_nodes(two_node_plan(), nodes, SLOT_RESOURCE)  # type: ignore[arg-type]
    assert {k: n.address for k, n in mapping.items()} == {0: "198.18.0.10", 1: "198.18.0.11"}
    # plan node 1 unpinned: it takes the first unpinned node, never the one pinned to plan node 0
    nodes[0]["Resources"] = {"disaggsdk_slot": 1}
    mapping = map_plan_nodes(two_node_plan(), nodes, SLOT_RESOURCE)  # type: ignore[arg-type]
    assert {k: n.address for k, n in mapping.items()} == {0: "198.18.0.10", 1: "198.18.0.11"}


def test_a_pinned_node_without_room_is_an_error_not_a_move():
    nodes = [ray_node("a" * 16, "198.18.0.10", disaggsdk_slot=1, **{pin_resource(0): 1}),
             ray_node("b" * 16, "198.18.0.11", **{pin_resource(1): 1}),  # no slot
             ray_node("c" * 16, "198.18.0.12", disaggsdk_slot=8)]
    with pytest.raises(LaunchError, match=r"plan node 1 needs 1 disaggsdk_slot on one Ray node; no unused node"):
        map_plan_nodes(two_node_plan(), nodes, SLOT_RESOURCE)  # type: ignore[arg-type]


def test_units_listen_on_their_node_address_only_when_the_nodes_are_on_several_hosts():
    launcher = RayLauncher()
    here, there = RayNode("a" * 16, "198.18.0.10", {}), RayNode("b" * 16, "198.18.0.11", {})
    args = ch.UnitArgs("decode-0", "decode-0", "decode", "", b"", "tcp", "/tmp/x.log", "/tmp")
    launcher.nodes = {0: here, 1: there}
    assert launcher.node_address(args, there) == "198.18.0.11"
    verbs = msgspec.structs.replace(args, provider="verbs")
    assert launcher.node_address(verbs, there) is None  # a NIC provider picks its own domain
    launcher.nodes = {0: here, 1: RayNode("c" * 16, "198.18.0.10", {})}  # logical nodes of one host
    assert launcher.node_address(args, here) is None


def test_the_testbed_pins_its_nodes_with_the_launchers_resource():
    from disaggsdk.testbed.ray_cluster import PIN_RESOURCE_PREFIX

    assert pin_resource(3) == f"{PIN_RESOURCE_PREFIX}3"  # spelt out twice: the testbed imports no launch code


def test_a_unit_opens_its_tcp_endpoint_on_the_interface_holding_its_node_address(monkeypatch):
    from disaggsdk.launch.unit_process.parts import kv_domain
    from disaggsdk.transfer.errors import TransferError
    from disaggsdk.transfer.interfaces import TCP_IFACE_ENV

    monkeypatch.delenv(TCP_IFACE_ENV, raising=False)
    args = ch.UnitArgs("decode-0", "decode-0", "decode", "", b"", "tcp", "/tmp/x.log", "/tmp")
    assert kv_domain(args) == "lo"  # every peer on this machine
    assert kv_domain(msgspec.structs.replace(args, node_address="127.0.0.1")) == "lo"
    assert kv_domain(msgspec.structs.replace(args, provider="shm", node_address="127.0.0.1")) is None
    with pytest.raises(TransferError, match="no network interface here holds 192.0.2.7"):
        kv_domain(msgspec.structs.replace(args, node_address="192.0.2.7"))
