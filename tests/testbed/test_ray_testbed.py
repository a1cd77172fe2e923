"""`up(..., ray=RayOptions())`: a Ray cluster across two testbed nodes, the head in node 0 and a
node joined from node 1 over the shaped link; `down` stops every Ray process. Slow (two
``ray start`` and ``ray status`` runs): `make test-all`."""

from __future__ import annotations

import pytest

from disaggsdk.testbed import LinkSpec, RayOptions, down
from disaggsdk.testbed.ray_cluster import count_active_nodes, ray_argv, ray_env
from tests.testbed.conftest import pids_in_netns, running

pytest.importorskip("ray")

RAY_STATUS = """======== Autoscaler status: 2026-12-06 17:20:00 ========
Node status
---------------------------------------------------------------
Active:
 1 node_3f2a9c0d1e
 1 node_77aa00bb11
Pending:
 (no pending nodes)
Recent failures:
 (no failures)
"""


def test_count_active_nodes_reads_ray_status():
    assert count_active_nodes(RAY_STATUS) == 2
    assert count_active_nodes(RAY_STATUS.replace(" 1 node_77aa00bb11\n", "")) == 1
    assert count_active_nodes("") == 0


def _ray_processes_in(node) -> list[str]:
    # the node's own /proc (its pid namespace): Ray's daemons are gcs_server, raylet and Python workers
    listed = node.run(["sh", "-c", "cat /proc/[0-9]*/comm"], check=False).stdout.split()
    return [comm for comm in listed if comm in ("gcs_server", "raylet") or comm.startswith("ray::")]


@pytest.mark.slow
def test_a_two_node_ray_cluster_across_namespaces(testbed):
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=1000),
                 ray=RayOptions(num_cpus=1, object_store_bytes=80 << 20))
    assert tb.ray_address == "198.18.0.10:6379"
    seen = tb.node(1).run(ray_argv("status", f"--address={tb.ray_address}"), env=ray_env(), timeout_s=60)
    assert count_active_nodes(seen.stdout) == 2, seen.stdout
    assert "raylet" in _ray_processes_in(tb.node(1)) and "gcs_server" in _ray_processes_in(tb.node(0))
    pids = [pid for node in tb.nodes for pid in pids_in_netns(node.namespace)]
    assert len(pids) > 6  # anchors, unshares, each node's raylet and workers, the head's GCS
    assert down(tb.name, tb.state_file.parent) is True
    assert [pid for pid in pids if running(pid)] == []  # Ray stopped, the anchors and their nodes gone
