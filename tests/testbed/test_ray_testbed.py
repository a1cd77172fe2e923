"""`up(..., ray=RayOptions())`: a Ray cluster across two testbed nodes, the head in node 0 and a
node joined from node 1 over the shaped link; `down` stops every Ray process. Slow (two
``ray start`` and ``ray status`` runs): `make test-all`."""

from __future__ import annotations

import pytest

from disaggsdk.testbed import LinkSpec, RayOptions, down
from disaggsdk.testbed.errors import TestbedError
from disaggsdk.testbed.ray_cluster import count_active_nodes, ensure_ray_token, ray_argv, ray_env
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


def test_a_fresh_home_gets_a_ray_token_and_an_existing_one_is_kept(tmp_path):
    """``ray start --head`` in token mode makes no token: on a machine that never ran Ray the testbed makes it."""
    env = {**ray_env(), "HOME": str(tmp_path), "RAY_AUTH_MODE": "token"}
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    token_file = tmp_path / ".ray" / "auth_token"
    assert ensure_ray_token(env) is True
    token = token_file.read_text()
    assert len(token) >= 32
    assert ensure_ray_token(env) is False and token_file.read_text() == token  # kept, not replaced
    assert ensure_ray_token({**env, "HOME": str(tmp_path / "other"), "RAY_AUTH_MODE": "disabled"}) is False
    assert ensure_ray_token({**env, "HOME": str(tmp_path / "other"), "RAY_AUTH_TOKEN": "t" * 32}) is False
    assert not (tmp_path / "other").exists()
    with pytest.raises(TestbedError, match="RAY_AUTH_TOKEN_PATH"):
        ensure_ray_token({**env, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")})


def _ray_processes_in(node) -> list[str]:
    # the node's own /proc (its pid namespace): Ray's daemons are gcs_server, raylet and Python workers
    listed = node.run(["sh", "-c", "cat /proc/[0-9]*/comm"], check=False).stdout.split()
    return [comm for comm in listed if comm in ("gcs_server", "raylet") or comm.startswith("ray::")]


@pytest.mark.slow
def test_a_two_node_ray_cluster_across_namespaces(testbed, tmp_path, monkeypatch):
    # as on a machine that never ran Ray: a HOME of its own, under /tmp (which each node replaces)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    tb = testbed(nodes=2, link=LinkSpec(rate_mbit=1000),
                 ray=RayOptions(num_cpus=1, object_store_bytes=80 << 20))
    assert tb.ray_address == "198.18.0.10:6379"
    seen = tb.node(1).run(ray_argv("status", f"--address={tb.ray_address}"), env=ray_env(), timeout_s=60)
    assert count_active_nodes(seen.stdout) == 2, seen.stdout
    assert (tmp_path / ".ray" / "auth_token").is_file()
    assert "raylet" in _ray_processes_in(tb.node(1)) and "gcs_server" in _ray_processes_in(tb.node(0))
    pids = [pid for node in tb.nodes for pid in pids_in_netns(node.namespace)]
    assert len(pids) > 6  # anchors, unshares, each node's raylet and workers, the head's GCS
    assert down(tb.name, tb.state_file.parent) is True
    assert [pid for pid in pids if running(pid)] == []  # Ray stopped, the anchors and their nodes gone
