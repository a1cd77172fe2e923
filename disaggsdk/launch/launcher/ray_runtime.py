"""RayRuntime: a spec's units as Ray actors on a cluster's nodes (`launch: {backend: ray}`).

The same runtime as `LocalRuntime` (`supervisor.Supervisor`: handshake, reader thread, failure
reports, restarts, clean close) with `launch.launcher.ray_launcher.RayLauncher` starting the units where the
plan places them. Between nodes KV moves over libfabric's tcp provider (a spec that asks for shm
gets tcp when its plan spans nodes: shared memory does not cross machines); verbs or efa stay as asked.
"""

from __future__ import annotations

from collections.abc import Callable

from disaggsdk.launch.launcher.restart_budget import DEFAULT_RESTART_WINDOW_S
from disaggsdk.launch.launcher.supervisor import DEFAULT_MAX_RESTARTS, Supervisor
from disaggsdk.launch.launcher.units import CpuAffinity
from disaggsdk.spec.types import Spec


def RayRuntime(spec: Spec, address: str | None = None, tiny: bool = False,
               colocated: bool = False, cpu_affinity: CpuAffinity = None, log_dir: str | None = None,
               provider: str | None = None, start_timeout_s: float = 300.0,
               on_event: Callable[[str], None] | None = None, secret: bytes | None = None,
               max_restarts: int = DEFAULT_MAX_RESTARTS, restart_window_s: float = DEFAULT_RESTART_WINDOW_S,
               on_progress: Callable[[str], None] | None = None) -> Supervisor:
    """A deployment on a Ray cluster, started (a `Runtime`); serve it with `serve.router.Router`.

    Args:
        spec: the deployment.
        address: the Ray cluster (``"auto"``: the one ``ray start`` started here; ``"HOST:PORT"``);
            None: the cluster this process already joined, the one running on this machine, or a new
            one-node cluster (with the `disaggsdk_slot`s a CPU spec needs).
        tiny: run the spec's topology with its tiny model on the CPU (see `tiny_spec`).
        cpu_affinity: ignored: Ray places the units.
        colocated, log_dir, provider, start_timeout_s, on_event, secret, max_restarts,
            restart_window_s, on_progress: as for `LocalRuntime` (`supervisor.Supervisor`).
    Raises:
        LaunchError: the cluster lacks room for the plan (per node), or a unit failed to start.
    """
    from disaggsdk.launch.launcher.ray_launcher import RayLauncher

    del cpu_affinity  # accepted so that every runtime takes the same options
    runtime = Supervisor(spec, RayLauncher(address), tiny=tiny, colocated=colocated, log_dir=log_dir,
                         provider=provider, start_timeout_s=start_timeout_s, on_event=on_event, secret=secret,
                         max_restarts=max_restarts, restart_window_s=restart_window_s, on_progress=on_progress)
    runtime.start()
    return runtime
