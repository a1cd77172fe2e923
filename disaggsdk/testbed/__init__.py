"""Many machines on one: a testbed of nodes in their own namespaces, joined by shaped links."""

from disaggsdk.testbed.errors import NetemUnavailable, PacketDropUnavailable, TestbedError, TestbedUnavailable
from disaggsdk.testbed.link import LinkSpec, netem_available
from disaggsdk.testbed.link_faults import add_jitter, cut_link, drop_packets, heal_link, link_is_cut, nftables_available
from disaggsdk.testbed.node import LinkCounters, Node
from disaggsdk.testbed.ray_cluster import RayOptions
from disaggsdk.testbed.testbed import NodeStatus, Testbed, down, load, status, up
from disaggsdk.testbed.tools import require_tools

__all__ = ["LinkCounters", "LinkSpec", "NetemUnavailable", "Node", "NodeStatus", "PacketDropUnavailable", "RayOptions",
           "Testbed", "TestbedError", "TestbedUnavailable", "add_jitter", "cut_link", "down", "drop_packets",
           "heal_link", "link_is_cut", "load", "netem_available", "nftables_available", "require_tools", "status",
           "up"]
