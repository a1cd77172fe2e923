"""A Ray cluster across a testbed's nodes: the head in node 0, one Ray node in every other node.

Each Ray node is started with ``ray start`` inside its testbed node (`Node.run`), so its processes
live in that node's namespaces: they bind the node's address, keep their session files in the
node's own /tmp and their object store in its own /dev/shm, and a ``ray stop`` there sees only
that node's processes (the node has its own pid namespace). The host cannot reach the testbed's
addresses: a driver joins the cluster from inside a node, at `RayOptions` ``port`` of node 0.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from disaggsdk.testbed.errors import TestbedError
from disaggsdk.testbed.node import Node

RAY_START_TIMEOUT_S = 120.0
RAY_STOP_TIMEOUT_S = 30.0
RAY_JOIN_TIMEOUT_S = 60.0
# the launcher's resource that pins a Ray node to a plan node (spelt out here: the testbed imports
# nothing but the standard library)
PIN_RESOURCE_PREFIX = "disaggsdk_node_"
# `ray status`: under "Active:", one line per alive node such as " 1 node_3f2a..."
_ACTIVE_NODE_LINE = re.compile(r"^\s*\d+\s+node_[0-9a-f]+")


@dataclass(frozen=True)
class RayOptions:
    """How the Ray node in each testbed node starts.

    Attributes:
        port: the head's GCS port in node 0 (each node has its own ports: no clash with the host).
        num_cpus: CPUs each Ray node offers; None: Ray counts the machine's.
        resources: custom resources each Ray node offers (``{"disaggsdk_slot": 8}`` for CPU specs);
            node K offers ``disaggsdk_node_K: 1`` besides, which pins it to a deployment's plan node K.
        object_store_bytes: each node's object store size; None: Ray's default.
    """

    port: int = 6379
    num_cpus: int | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    object_store_bytes: int | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(f"Ray port {self.port}: give 1..65535")
        if self.num_cpus is not None and self.num_cpus < 0:
            raise ValueError(f"Ray num_cpus {self.num_cpus}: give zero or more")


def ray_argv(*args: str) -> list[str]:
    """The ``ray`` command line of this Python's Ray (the venv's, whatever PATH says)."""
    return [sys.executable, "-m", "ray.scripts.scripts", *args]


def ray_env() -> dict[str, str]:
    """The environment of a ``ray`` command in a node: no RAY_ADDRESS of the host's own cluster
    (it would join that instead), no usage report (nothing leaves the testbed), and one
    authentication mode for every node.

    Ray turns token authentication on for a head where a token file exists (``~/.ray/auth_token``)
    but not for a node joining it, which is then refused; so the mode is set for all of them:
    token, unless the caller's environment says otherwise. `start_ray` makes the token where there
    is none (`ensure_ray_token`: ``ray start --head`` does not); the other nodes read the same file
    (the nodes share the host's home directory, also one under /tmp), and so does a driver started
    in a node with this environment.
    """
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env.setdefault("RAY_AUTH_MODE", "token")
    return env


def start_ray(nodes: Sequence[Node], options: RayOptions) -> str:
    """Start a Ray node in each of ``nodes`` (head in the first) and wait until the head sees all.

    Returns:
        the cluster's address, ``198.18.0.10:PORT``.

    Raises:
        TestbedError: a ``ray start`` failed or the nodes did not all join in time. The caller
            tears the testbed down (killing the node's anchor stops its Ray processes).
    """
    head = nodes[0]
    address = f"{head.address}:{options.port}"
    ensure_ray_token(ray_env())
    common = ["--disable-usage-stats"]
    if options.num_cpus is not None:
        common.append(f"--num-cpus={options.num_cpus}")
    if options.object_store_bytes is not None:
        common.append(f"--object-store-memory={options.object_store_bytes}")

    def resources(k: int) -> str:
        # node K also offers disaggsdk_node_K, which pins it to a deployment's plan node K
        # (disaggsdk.launch.launcher.ray_nodes.pin_resource): prefill on node 0, decode on node 1
        return f"--resources={json.dumps({**options.resources, f'{PIN_RESOURCE_PREFIX}{k}': 1})}"

    _ray_start([(head, ["--head", f"--node-ip-address={head.address}", f"--port={options.port}",
                        "--include-dashboard=false", *common, resources(0)])])
    # the others join at once, each in its own node
    _ray_start([(node, [f"--address={address}", f"--node-ip-address={node.address}", *common, resources(k)])
                for k, node in enumerate(nodes) if k > 0])
    wait_for_ray_nodes(head, address, len(nodes))
    return address


def ensure_ray_token(env: Mapping[str, str]) -> bool:
    """Make Ray's authentication token where ``env`` asks for token authentication and no token
    exists (no ``RAY_AUTH_TOKEN``, no file at ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``), as
    ``ray get-auth-token --generate`` does: ``ray start --head`` in token mode does not make one,
    so on a machine that never ran Ray it fails ("Token authentication is enabled but no
    authentication token was found").

    Returns:
        whether a token was made (in ``~/.ray/auth_token`` of the HOME in ``env``).

    Raises:
        TestbedError: Ray could not make it.
    """
    if env.get("RAY_AUTH_MODE", "").lower() != "token" or env.get("RAY_AUTH_TOKEN"):
        return False
    token_path = env.get("RAY_AUTH_TOKEN_PATH")
    home = env.get("HOME") or os.path.expanduser("~")
    if os.path.isfile(token_path) if token_path else os.path.isfile(os.path.join(home, ".ray", "auth_token")):
        return False
    if token_path:  # Ray writes only the default path: a named path must be the caller's file
        raise TestbedError(f"RAY_AUTH_TOKEN_PATH names {token_path}, which does not exist: make the token there "
                           "(`ray get-auth-token --generate` writes ~/.ray/auth_token) or unset it")
    # the token goes to stdout: it is read and dropped here, never printed
    done = subprocess.run(ray_argv("get-auth-token", "--generate"), capture_output=True, text=True,
                          env=dict(env), timeout=RAY_STOP_TIMEOUT_S)
    if done.returncode != 0:
        raise TestbedError(f"could not make Ray's authentication token: {done.stderr.strip()[-1000:]}")
    return True


def _ray_start(starts: Sequence[tuple[Node, list[str]]]) -> None:
    # output to a file, not a pipe: the daemons `ray start` leaves running could hold a pipe open,
    # and waiting for its end would wait for them
    running = []
    for node, args in starts:
        log = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        running.append((node, log, node.popen(ray_argv("start", *args), stdout=log, stderr=subprocess.STDOUT,
                                              env=ray_env())))
    failed = []
    for node, log, proc in running:
        try:
            code = proc.wait(RAY_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if code != 0:
            log.seek(0)
            failed.append(f"node {node.name}: ray start failed ({code}): {log.read().strip()[-1000:]}")
        log.close()
    if failed:
        raise TestbedError("; ".join(failed))


def count_active_nodes(ray_status_text: str) -> int:
    """How many alive nodes a ``ray status`` report lists under "Active:"."""
    count, active = 0, False
    for line in ray_status_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("Active:"):
            active = True
        elif stripped.endswith(":") and active:
            active = False  # "Pending:", "Recent failures:" end the list
        elif active and _ACTIVE_NODE_LINE.match(line):
            count += 1
    return count


def wait_for_ray_nodes(node: Node, address: str, expected: int, timeout_s: float = RAY_JOIN_TIMEOUT_S) -> int:
    """Ask ``ray status`` in ``node`` until the cluster at ``address`` has ``expected`` alive nodes.

    Returns:
        the number it saw.

    Raises:
        TestbedError: fewer than ``expected`` after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    seen, report = 0, ""
    while True:
        done = node.run(ray_argv("status", f"--address={address}"), check=False, env=ray_env(), timeout_s=timeout_s)
        report = done.stdout + done.stderr
        seen = count_active_nodes(done.stdout) if done.returncode == 0 else 0
        if seen >= expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if seen < expected:
        raise TestbedError(f"the Ray cluster at {address} has {seen} of {expected} nodes after {timeout_s:g} s: "
                           f"{report.strip()[-1000:]}")
    return seen


def stop_ray(nodes: Sequence[Node]) -> None:
    """``ray stop --force`` in every node that still runs, all at once; failures are ignored
    (the node's anchor is killed next, which ends whatever Ray left)."""
    stopping = [node.popen(ray_argv("stop", "--force"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env=ray_env()) for node in nodes if node.is_alive()]
    for proc in stopping:
        try:
            proc.wait(RAY_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
