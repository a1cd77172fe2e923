"""RayRuntime: a spec's units as Ray actors on a cluster's nodes (`launch: {backend: ray}`).

The same runtime as `LocalRuntime` (handshake, reader thread, failure reports, restarts, clean
close) with `launch.ray_launcher.RayLauncher` starting the units where the plan places them.
Between nodes KV moves over libfabric's tcp provider (a spec that asks for shm gets tcp when its
plan spans nodes: shared memory does not cross machines); verbs or efa stay as asked.
"""

from __future__ import annotations

from typing import Any

from disaggsdk.launch.runtime import LocalRuntime
from disaggsdk.launch.tiny import tiny_spec
from disaggsdk.spec.types import Spec


class RayRuntime(LocalRuntime):
    """A deployment on a Ray cluster (a `Runtime`); serve it with `serve.router.Router`.

    Args:
        spec: the deployment.
        address: the Ray cluster (``"auto"``: the one ``ray start`` started here; ``"HOST:PORT"``);
            None: the cluster this process already joined, the one running on this machine, or a new
            one-node cluster (with the `disaggsdk_slot`s a CPU spec needs).
        tiny: run the spec's topology with its tiny model on the CPU (see `tiny_spec`).
        options: `LocalRuntime`'s other keyword arguments (``provider``, ``max_restarts``, ...);
            ``cpu_affinity`` does not apply (Ray places the units).
    Raises:
        LaunchError: the cluster lacks room for the plan (per node), or a unit failed to start.
    """

    def __init__(self, spec: Spec, address: str | None = None, tiny: bool = False, **options: Any):
        from disaggsdk.launch.ray_launcher import RayLauncher
        from disaggsdk.plan import make_plan

        resolved = tiny_spec(spec) if tiny else spec
        plan = make_plan(resolved)
        provider = options.pop("provider", None) or resolved.transport.provider
        if plan.num_nodes > 1 and provider in ("shm", "auto"):
            provider = "tcp"
        options.pop("cpu_affinity", None)
        self.ray_launcher = RayLauncher(plan, address)
        super().__init__(spec, tiny=tiny, provider=provider, launcher=self.ray_launcher, **options)
