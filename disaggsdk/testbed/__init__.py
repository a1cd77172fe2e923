"""Many machines on one: a testbed of nodes in their own namespaces, joined by shaped links.

Each node is a network namespace with its own mount (own /dev/shm and /tmp), UTS (hostname), IPC
and pid namespaces, linked by a veth to one bridge; ``tc`` shapes every link's rate (tbf) and,
where the kernel has sch_netem, its delay and loss (without it, nftables drops the loss).
Addresses come from 198.18.0.0/15 and exist only inside the namespaces the testbed made. Needs
root and iproute2; uses only the standard library. `up` builds one, `status` reads its links'
counters, `down` removes it::

    from disaggsdk.testbed import LinkSpec, up
    with up(nodes=2, link=LinkSpec(rate_mbit=100)) as tb:
        print(tb.node(0).run(["hostname"]).stdout)  # testbed-n0

`link_faults` cuts and heals a link, drops a share of its packets or adds jitter while a
testbed runs. See docs/testbed.md; the CLI is ``disaggsdk testbed up|status|down``.
"""

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
