"""The testbed's JSON forms: the state file that `status` and `down` read from another process, and
the ``--json`` output. Typed, so writer and reader agree on each field (standard library only, as
the rest of the testbed)."""

from __future__ import annotations

from typing import TypedDict


class LinkState(TypedDict):
    """A `LinkSpec`."""

    rate_mbit: float
    delay_ms: float
    loss_pct: float


class NodeState(TypedDict):
    """A `Node`: where it is and the processes that hold it."""

    name: str
    index: int
    address: str
    namespace: str
    interface: str
    switch_port: str
    anchor_pid: int
    unshare_pid: int


class StateFile(TypedDict):
    """A `Testbed`: the state file's contents, and ``testbed up --json``."""

    version: int
    name: str
    link: LinkState
    switch_namespace: str
    nodes: list[NodeState]
    ray_address: str | None
    complete: bool
    state_file: str


class NodeStatusState(TypedDict):
    """A `NodeStatus`: ``testbed status --json``, per node."""

    name: str
    address: str
    namespace: str
    alive: bool
    rx_bytes: int
    tx_bytes: int


class DelayerState(TypedDict):
    """A `packet_delay.Delayer`: one user-space packet delayer of a node's link. A record
    (``NAME-nK.PURPOSE.delayers.json`` beside the state file, its own file so a fault added from one
    process is found by a heal or a `down` in another) holds a list of them."""

    pid: int
    namespace: str
    interface: str
    queue_num: int
    source: str | None
    delay_ms: float
    jitter_ms: float
