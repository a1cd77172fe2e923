"""Units as Ray actors on a cluster's nodes: the `base.Launcher` `launch.launcher.supervisor.start_ray_runtime` uses.

One placement group per instance, its bundles one per unit (a unit holds its tp ranks), packed
(STRICT_PACK) on the Ray node the plan's node maps to (`launch.launcher.ray_nodes`). Where the bundles
landed is checked against the plan before any unit starts, and again for every unit actor. Each
unit connects back to this driver over TCP (`launch.launcher.ray_unit_host`), so the runtime reads it as it
reads a local unit; only its process handle differs (`RayUnitProcess`).
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
import time
from typing import TYPE_CHECKING

import msgspec

from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import LaunchError, UnitHandle
from disaggsdk.launch.channel import FrameChannel
from disaggsdk.launch.launcher.ray_nodes import SLOT_RESOURCE, RayNode, map_plan_nodes, rank_resource, ranks_per_node
from disaggsdk.launch.launcher.ray_unit_host import TOKEN_BYTES, UnitHostActor, UnitStart, keepalive, kill_actor, unit_host_actor
from disaggsdk.launch.launcher.units import unit_names

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from disaggsdk.plan import Instance, Plan

PLACEMENT_TIMEOUT_S = 60.0
ACTOR_CALL_TIMEOUT_S = 30.0


class RayUnitProcess:
    """A unit process on a Ray node (a `base.UnitProcess`)."""

    def __init__(self, actor: UnitHostActor, pid: int, same_host: bool, log_path: str | None = None):
        self.actor = actor
        self._log_path = log_path
        self._pid, self._same_host = pid, same_host
        self._exitcode: int | None = None
        self._tail: str | None = None  # read from its node before its actor goes

    @property
    def pid(self) -> int:
        """The unit's pid where it can name a process here: on this host; else -1 (its shm files and
        CPU time are its own node's business)."""
        return self._pid if self._same_host else -1

    @property
    def sentinel(self) -> None:
        """Nothing to wait on here: the unit's channel closing says it died."""
        return None

    @property
    def exitcode(self) -> int | None:
        return self._exitcode

    def is_alive(self) -> bool:
        import ray

        if self._exitcode is not None:
            return False
        try:
            return bool(ray.get(self.actor.alive.remote(), timeout=ACTOR_CALL_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - the actor (or its node) is gone
            return False

    def join(self, timeout: float | None = None) -> None:
        """Wait for the unit to exit; then the actor goes too, freeing its bundle for a restart."""
        import ray

        if self._exitcode is not None:
            return
        try:
            code = ray.get(self.actor.join.remote(timeout), timeout=(timeout or 0) + ACTOR_CALL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the actor died with it (killed, or its node lost)
            code = -9
        if code is not None:
            self._exitcode = code
            self._tail = self._remote_tail()
            kill_actor(self.actor)

    def log_tail(self, path: str) -> str:
        """The last lines of the unit's log: read on this host when it runs here, else by its actor
        on its node (kept from before the actor went)."""
        from disaggsdk.launch.launcher.units import log_tail

        if self._same_host:
            return log_tail(path)
        return self._tail if self._tail is not None else self._remote_tail(path) or "(no log)"

    def _remote_tail(self, path: str | None = None) -> str | None:
        import ray

        if self._same_host or (path is None and self._log_path is None):
            return None
        try:
            return ray.get(self.actor.log_tail.remote(path or self._log_path), timeout=ACTOR_CALL_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - its node is gone, and its log with it
            return None

    def kill(self) -> None:
        """End the unit by ending its actor (the unit dies with it)."""
        kill_actor(self.actor)


class RayLauncher:
    """Start units as actors in placement groups that follow the plan's placement (a `base.Launcher`).

    Args:
        address: the cluster (``"auto"``, ``"HOST:PORT"``); None: the one running on this machine,
            else a new one-node cluster (`_join_or_start`). A driver already connected stays connected.
            Joined by `start`, which places the groups.
    """

    def __init__(self, address: str | None = None):
        self.address = address
        self.nodes: dict[int, RayNode] = {}  # plan node -> its Ray node
        self.unit_nodes: dict[str, RayNode] = {}  # unit -> the Ray node it runs on
        self.host = ""  # this driver's IP, where units connect back
        self._own_ray = False
        self._groups: dict[str, PlacementGroup] = {}
        self._actors: list[UnitHostActor] = []  # every unit actor started, for close() to see gone
        self._bundle: dict[str, tuple[Instance, int]] = {}  # unit -> (its instance, its bundle index)
        self._resource = ""
        self._listener: socket.socket | None = None
        self._early: dict[bytes, socket.socket] = {}

    def provider_for(self, plan: Plan, provider: str) -> str:
        """tcp where the spec asks for shm (or "auto") and the plan spans nodes: shared memory does
        not cross machines; verbs or efa stay as asked."""
        return "tcp" if plan.num_nodes > 1 and provider in ("shm", "auto") else provider

    def start(self, plan: Plan) -> None:
        """Join (or start) the cluster, place one placement group per instance and check where each landed.

        Raises:
            LaunchError: the cluster lacks room for the plan, or a placement group did not land on
                the node the plan says (what is missing is named, per node).
        """
        import ray
        from ray.util.placement_group import placement_group

        self._own_ray = not ray.is_initialized()
        if self._own_ray:
            _join_or_start(self.address, plan)
        try:
            self._resource = resource = rank_resource(plan.spec)
            self.nodes = map_plan_nodes(plan, ray.nodes(), resource)  # type: ignore[no-untyped-call]  # ray: untyped
            for inst in plan.instances:
                units = [name for name, i in unit_names(plan) if i.name == inst.name]
                node = self.nodes[inst.nodes[0]]
                pg = placement_group([{resource: inst.tp} for _ in units], strategy="STRICT_PACK",
                                     name=f"disaggsdk-{inst.name}", _soft_target_node_id=node.node_id)
                self._groups[inst.name] = pg
                for k, name in enumerate(units):
                    self._bundle[name] = (inst, k)
            for inst in plan.instances:
                self._check_group(inst, self._groups[inst.name])
            self.host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]  # ray: untyped
            self._listener = socket.create_server((self.host, 0))
        except BaseException:
            self.close()
            raise

    def _check_group(self, inst: Instance, pg: PlacementGroup) -> None:
        import ray
        from ray.util.placement_group import placement_group_table

        inst_name, node = inst.name, self.nodes[inst.nodes[0]]
        try:
            ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - GetTimeoutError and friends
            raise LaunchError(f"the placement group of {inst_name} did not fit on Ray node {node.short_id} "
                              f"({node.address}) in {PLACEMENT_TIMEOUT_S:.0f} s: {exc}") from None
        landed = set(placement_group_table(pg)["bundles_to_node_id"].values())
        if landed != {node.node_id}:
            raise LaunchError(f"{inst_name}'s bundles landed on Ray nodes {sorted(n[:8] for n in landed)}, not on "
                              f"{node.short_id} as the plan says; free room on that node")

    def spawn(self, args: ch.UnitArgs) -> UnitHandle:
        """Start one unit's actor in its bundle and wait for the unit to connect.

        Raises:
            LaunchError: the actor did not start, landed on another node, or its unit did not connect.
        """
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._listener is None:
            raise LaunchError("the Ray launcher is not started (or already closed)")
        inst, index = self._bundle[args.name]
        node = self.nodes[inst.nodes[0]]
        self._check_alive(args.name, node)
        strategy = PlacementGroupSchedulingStrategy(self._groups[inst.name], placement_group_bundle_index=index)
        # Ray takes GPUs as num_gpus, never in resources, and shows the actor (and the unit it starts)
        # the granted ones as CUDA_VISIBLE_DEVICES: tp rank r of the unit uses cuda:r
        amount: dict[str, object] = ({"num_gpus": inst.tp} if self._resource == "GPU"
                                     else {"resources": {self._resource: inst.tp}})
        actor = unit_host_actor().options(scheduling_strategy=strategy, name=None, **amount).remote()
        self._actors.append(actor)
        token = secrets.token_bytes(TOKEN_BYTES)
        # no parent pid: the unit's parent is its actor, which it dies with
        unit_args = msgspec.msgpack.encode(msgspec.structs.replace(args, parent_pid=0,
                                                                   node_address=self.node_address(args, node)))
        payload = msgspec.msgpack.encode(UnitStart(unit_args, self.host, self._listener.getsockname()[1], token))
        try:
            started = ray.get(actor.start.remote(payload), timeout=PLACEMENT_TIMEOUT_S)
            if started.node_id != node.node_id:
                raise LaunchError(f"unit {args.name} started on Ray node {started.node_id[:8]}, "
                                  f"not {node.short_id} as the plan says (was its node lost?)")
            sock = self._accept(self._listener, token, PLACEMENT_TIMEOUT_S)
        except BaseException as exc:
            kill_actor(actor)
            if isinstance(exc, LaunchError):
                raise
            self._check_alive(args.name, node)  # its node died meanwhile: say that, not Ray's cancellation
            raise LaunchError(f"unit {args.name} did not start on Ray node {node.short_id}: {exc}") from None
        self.unit_nodes[args.name] = node
        process = RayUnitProcess(actor, started.pid, same_host=started.address == self.host, log_path=args.log_path)
        return UnitHandle(args, process, FrameChannel(sock, ch.FROM_UNIT))

    def node_address(self, args: ch.UnitArgs, node: RayNode) -> str | None:
        """The address ``args``'s unit listens on for KV: its Ray node's IP when it speaks tcp and the
        plan's Ray nodes are on more than one host (their IPs differ), so peers on the other hosts
        reach it; None (loopback) when every Ray node is on this one host."""
        hosts = {n.address for n in self.nodes.values()}
        return node.address if args.provider.startswith("tcp") and len(hosts) > 1 else None

    @staticmethod
    def _check_alive(unit: str, node: RayNode) -> None:
        """Raise `LaunchError` when ``unit``'s planned node is gone (Ray would move the bundle off the plan)."""
        import ray

        nodes = ray.nodes()  # type: ignore[no-untyped-call]  # ray: untyped
        if not any(n["NodeID"] == node.node_id and n.get("Alive") for n in nodes):
            raise LaunchError(f"unit {unit}'s Ray node {node.short_id} ({node.address}) is gone: not the plan's "
                              f"node any more, so the unit stays down")

    def _accept(self, listener: socket.socket, token: bytes, timeout_s: float) -> socket.socket:
        """The connection that opens with ``token`` (others that arrive first wait for their turn)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for seen in list(self._early):
                if hmac.compare_digest(seen, token):
                    return self._early.pop(seen)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LaunchError(f"no unit connected back to {self.host} within {timeout_s:.0f} s")
            listener.settimeout(remaining)
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            sock.settimeout(10)
            try:
                seen = sock.recv(TOKEN_BYTES, socket.MSG_WAITALL)
            except OSError:
                sock.close()
                continue
            if len(seen) != TOKEN_BYTES:
                sock.close()
                continue
            sock.settimeout(None)
            keepalive(sock)
            self._early[seen] = sock

    def placement(self) -> dict[str, str]:
        """Unit name -> where it runs: its plan node and the Ray node (id, address)."""
        plan_node = {n.node_id: p for p, n in self.nodes.items()}
        return {name: f"plan node {plan_node[node.node_id]}, Ray node {node.short_id} ({node.address})"
                for name, node in self.unit_nodes.items()}

    def close(self) -> None:
        """After the units stopped: end their actors and wait until they are gone, remove the
        placement groups, close the listener, leave Ray if this launcher joined it. Idempotent."""
        import ray
        from ray.util.placement_group import remove_placement_group

        deadline = time.monotonic() + ACTOR_CALL_TIMEOUT_S
        for actor in self._actors:
            kill_actor(actor)
        for actor in self._actors:
            while time.monotonic() < deadline:
                try:  # a call to a dead actor fails at once; to a dying one, once it died
                    ray.get(actor.alive.remote(), timeout=max(0.1, deadline - time.monotonic()))
                except Exception:  # noqa: BLE001 - RayActorError: gone, as wanted
                    break
                time.sleep(0.05)
        self._actors = []
        for pg in self._groups.values():
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - the cluster is gone already
                pass
        self._groups = {}
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            for sock in self._early.values():
                sock.close()
        if self._own_ray and ray.is_initialized():
            ray.shutdown()
            self._own_ray = False


def _join_or_start(address: str | None, plan: Plan) -> None:
    """Join the cluster at ``address``; without one, the cluster running on this machine (as
    ``ray start`` left it), else a new one-node cluster that offers the `SLOT_RESOURCE`s a CPU
    spec's largest plan node needs (Ray's own default would offer none)."""
    import ray

    def init(address: str | None, slots: dict[str, float] | None = None) -> None:
        ray.init(address=address, resources=slots, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)

    if address is not None:
        init(address)
        return
    try:
        init("auto")
        return
    except ConnectionError:  # no cluster runs here: start one
        pass
    init(None, {SLOT_RESOURCE: float(max(ranks_per_node(plan).values()))}
         if rank_resource(plan.spec) == SLOT_RESOURCE else None)
