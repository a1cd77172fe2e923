"""The runtime: a spec's units started by a `base.Launcher` and supervised (the `Runtime` seam), and the
two ways to start one: `start_local_runtime` (its units processes on this machine) and
`start_ray_runtime` (Ray actors on a cluster's nodes).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import wait as wait_any
from typing import TYPE_CHECKING, Protocol, TypedDict, Unpack

import attrs
import msgspec

from disaggsdk.engine.group_address import free_loopback_address
from disaggsdk.errors import SpecError
from disaggsdk.launch import messages as ch
from disaggsdk.launch.base import (
    ChannelClosed,
    ChannelError,
    DownListener,
    Launcher,
    LaunchError,
    MessageListener,
    Runtime,
    UnitCannotRun,
    UnitDown,
    UnitHandle,
    UnitStalled,
    UnitUnreachable,
)
from disaggsdk.launch.health import SilenceWatch, StallWatch, replace_poisoned_peer
from disaggsdk.launch.launcher.restart_budget import DEFAULT_RESTART_WINDOW_S, RestartBudget
from disaggsdk.launch.launcher.units import (
    CpuAffinity,
    ProcessLauncher,
    core_sets,
    dp_group_addresses,
    process_tree_cpu_s,
    rejoin_unit,
    start_units,
    stop_units,
    unit_log_tail,
    unit_names,
)
from disaggsdk.launch.progress import progress_line
from disaggsdk.launch.tiny import tiny_spec
from disaggsdk.spec.types import Spec
from disaggsdk.transfer.shm_files import remove_fabric_shm, remove_orphaned_fabric_shm

if TYPE_CHECKING:
    from disaggsdk.launch.kv_store_server import KVStoreServer

log = logging.getLogger(__name__)

DEFAULT_MAX_RESTARTS = 3
RESTART_BACKOFF_S = 0.5  # before the first restart of a unit; doubled for each next one


class RuntimeOptions(TypedDict, total=False):
    """The keywords `start_local_runtime` and `start_ray_runtime` share (see `Supervisor`)."""

    tiny: bool
    colocated: bool
    cpu_affinity: CpuAffinity
    log_dir: str | None
    provider: str | None
    start_timeout_s: float
    on_event: Callable[[str], None] | None
    on_progress: Callable[[str], None] | None
    secret: bytes | None
    max_restarts: int
    restart_window_s: float


def start_local_runtime(spec: Spec, launcher: Launcher | None = None, **options: Unpack[RuntimeOptions]) -> Supervisor:
    """A whole deployment as local processes, started (a `Runtime`); serve it with `serve.routing.router.Router`.

    The `Supervisor` of ``spec``'s units with a `units.ProcessLauncher` (or ``launcher``), after its
    `Supervisor.start`; see `Supervisor` for the arguments.

    Raises:
        LaunchError: a `device: cuda` plan on more devices than this machine has, or a unit that failed
            to start (with its log tail).
        UnitCannotRun: a unit found no CUDA device (one line, with what to do).
    """
    runtime = Supervisor(spec, launcher or ProcessLauncher(), **options)
    runtime.start()
    return runtime


def start_ray_runtime(spec: Spec, address: str | None = None, **options: Unpack[RuntimeOptions]) -> Supervisor:
    """A deployment on a Ray cluster, started (a `Runtime`); serve it with `serve.routing.router.Router`.

    The `Supervisor` of ``spec``'s units with a `ray_launcher.RayLauncher` starting them where the plan
    places them, after its `Supervisor.start`. Between nodes KV moves over libfabric's tcp provider (a
    spec that asks for shm gets tcp when its plan spans nodes: shared memory does not cross machines);
    verbs or efa stay as asked.

    Args:
        spec: the deployment.
        address: the Ray cluster (``"auto"``: the one ``ray start`` started here; ``"HOST:PORT"``);
            None: the cluster this process already joined, the one running on this machine, or a new
            one-node cluster (with the `disaggsdk_slot`s a CPU spec needs).
        options: as for `start_local_runtime` (`Supervisor`), but ``cpu_affinity``, which is
            ignored: Ray places the units.
    Raises:
        LaunchError: the cluster lacks room for the plan (per node), or a unit failed to start.
    """
    from disaggsdk.launch.launcher.ray_launcher import RayLauncher

    options.pop("cpu_affinity", None)  # accepted so that every runtime takes the same options
    runtime = Supervisor(spec, RayLauncher(address), **options)
    runtime.start()
    return runtime


class StartRuntime(Protocol):
    """A way to start a spec's units: `start_local_runtime`, `start_runtime`, or a test's own."""

    def __call__(self, spec: Spec, **options: Unpack[RuntimeOptions]) -> Runtime: ...


def start_runtime(spec: Spec, **options: Unpack[RuntimeOptions]) -> Supervisor:
    """The runtime ``spec.launch.backend`` names, started: `start_ray_runtime` at ``spec.launch.address``
    for ``ray``, else `start_local_runtime`.

    Args:
        spec: the deployment.
        options: the keywords both take (``tiny``, ``colocated``, ``log_dir``, ``on_event``, ...).
    Raises:
        LaunchError: as `start_local_runtime` or `start_ray_runtime`.
    """
    if spec.launch.backend == "ray":
        return start_ray_runtime(spec, address=spec.launch.address, **options)
    return start_local_runtime(spec, **options)


class Supervisor:
    """The units of one deployment, started by ``launcher`` and supervised (a `Runtime`).

    The constructor only resolves the spec and its plan; `start` starts the units.

    Args:
        spec: the deployment.
        launcher: where and how units start (`units.ProcessLauncher`, `ray_launcher.RayLauncher`).
        tiny: run a GPU spec's topology with its tiny model on the CPU (see `tiny_spec`).
        colocated: every instance "mixed" (prefill and decode in one engine): the baseline.
        cpu_affinity: None; "auto" (unit i on core i mod cores); or cores per unit in start order.
        log_dir: where unit logs go; None: a temporary directory close() removes unless a unit failed.
        provider: libfabric provider overriding the spec ("shm", "tcp").
        start_timeout_s: how long start-up may take.
        on_event: optional callback for failure and restart lines (default: print to stderr).
        on_progress: optional callback for start-up lines, one per unit and step (loading weights,
            compiling, ready) and the deployment's ready line (default: ``on_event``'s). `Cluster.launch`
            and ``disaggsdk launch`` print them to stdout: a notebook shows stdout as output, stderr as
            an error.
        secret: the control-frame secret (random when None).
        max_restarts: how often a unit that dies is started again within ``restart_window_s`` (a new
            incarnation, after a back-off that doubles from `RESTART_BACKOFF_S`); 0 leaves dead units dead.
        restart_window_s: how long a restart counts against ``max_restarts`` (`launch.launcher.restart_budget`):
            older ones are forgiven, so sporadic deaths never end a deployment, a crash loop does.
    Raises:
        LaunchError: the model has no tiny variant (``tiny``).
        SpecError: a rank does not fit its memory (`Plan.memory_problems`).
    """

    def __init__(self, spec: Spec, launcher: Launcher, *, tiny: bool = False, colocated: bool = False,
                 cpu_affinity: CpuAffinity = None, log_dir: str | None = None, provider: str | None = None,
                 start_timeout_s: float = 300.0, on_event: Callable[[str], None] | None = None,
                 secret: bytes | None = None, max_restarts: int = DEFAULT_MAX_RESTARTS,
                 restart_window_s: float = DEFAULT_RESTART_WINDOW_S, on_progress: Callable[[str], None] | None = None):
        from disaggsdk.plan import make_plan

        self._say = on_event or (lambda line: print(line, file=sys.stderr, flush=True))
        self._progress = on_progress or self._say
        self.spec = tiny_spec(spec) if tiny else spec
        self.plan = make_plan(self.spec)
        if self.plan.memory_problems:  # what `disaggsdk validate` refuses: nothing starts that cannot fit
            raise SpecError(self.plan.memory_problems)
        self.model_name = self.spec.model
        self.colocated = colocated
        self.launcher = launcher
        provider = launcher.provider_for(self.plan, provider or self.spec.transport.provider)
        self.provider = "shm" if provider == "auto" else provider
        self._cpu_affinity = cpu_affinity
        # per deployment: frames from anything else fail their MAC (tests pass one to forge frames)
        self._secret = secret or secrets.token_bytes(32)
        self._started = False
        self._closed = False
        self._closing = threading.Event()
        self._reader: threading.Thread | None = None
        self._on_message: MessageListener = lambda _unit, _msg: None
        self._on_unit_down: DownListener = lambda _unit, _report: None
        self.failures: list[str] = []  # one report per unit that died
        self._own_log_dir = log_dir is None
        self.log_dir = log_dir  # a temporary directory once started, when None
        self._work_dir: str | None = None  # made by start()
        self._kv_store: KVStoreServer | None = None  # `$.kv.tiers.store: launch`'s, started by start()
        self.max_restarts, self._start_timeout_s = max_restarts, start_timeout_s
        self._names = unit_names(self.plan)
        self._restarts = {name: RestartBudget(max_restarts, restart_window_s) for name, _ in self._names}
        self._restarting: set[str] = set()
        self._rejoining: dict[str, UnitHandle] = {}  # restarted processes still in their handshake
        # restarted units are spawned by one thread that lives as long as the runtime: a unit's
        # PDEATHSIG fires when the *thread* that spawned it exits, not only its process
        # what restarts together: one unit, or every unit of a lock-step dp group (engine.dp_lockstep:
        # its ranks share one process group, which a lone newcomer cannot join)
        self._restarts_due: queue.Queue[list[ch.UnitArgs] | None] = queue.Queue()
        self._groups_due: set[str] = set()  # group addresses of the groups queued for a restart
        self._restarter = threading.Thread(target=self._restart_loop, name="disaggsdk-restarts", daemon=True)
        self.units: dict[str, UnitHandle] = {}
        names, now_s = [name for name, _ in self._names], time.monotonic()
        self._stalls = StallWatch(self.spec.serve.unit_stall_s, names, now_s)  # the loops' frames
        self._reach = SilenceWatch(self.spec.serve.unit_unreachable_s, names, now_s)  # every frame

    def start(self) -> None:
        """Start every unit and wait until all are started; on failure nothing is left running.

        Raises:
            LaunchError: started before; no room for the plan (the launcher's: too few CUDA devices),
                or a unit that failed to start (with its log tail).
            UnitCannotRun: a unit found no CUDA device (one line, with what to do).
        """
        from disaggsdk.spec import spec_to_yaml

        if self._started or self._closed:
            raise LaunchError("a runtime starts once; make a new one")
        self._started = True
        atexit.register(self.close)
        try:
            self.launcher.start(self.plan)  # a `device: cuda` plan's devices are checked there and in each unit
            remove_orphaned_fabric_shm()  # what a launcher killed with SIGKILL left behind
            self.log_dir = self.log_dir or tempfile.mkdtemp(prefix="disaggsdk-logs-")
            os.makedirs(self.log_dir, exist_ok=True)
            self._work_dir = tempfile.mkdtemp(prefix="disaggsdk-run-")
            self._start_kv_store()
            affinity = core_sets(self._cpu_affinity, len(self._names))
            spec_yaml = spec_to_yaml(self.spec)
            addresses = dp_group_addresses(self.spec, self.plan)
            dp_ranks: dict[str, int] = {}
            for i, (name, inst) in enumerate(self._names):
                role = "mixed" if self.colocated else inst.role
                dp_rank = dp_ranks[inst.name] = dp_ranks.get(inst.name, -1) + 1
                args = ch.UnitArgs(name, inst.name, role, spec_yaml, self._secret, self.provider,
                                   os.path.join(self.log_dir, f"{name}.log"), self._work_dir, affinity[i],
                                   parent_pid=os.getpid(), dp_rank=dp_rank, group_address=addresses.get(inst.name))
                self.units[name] = self.launcher.spawn(args)
                log.info("unit %s (%s, instance %s) started as pid %d; its log: %s", name, role, inst.name,
                         self.units[name].process.pid, args.log_path)
            start_units(self.units, self._start_timeout_s, self._progress)
        except BaseException as exc:
            # a failed start keeps its logs, which the error names; a unit that cannot run here said all there is
            self._own_log_dir = self._own_log_dir and isinstance(exc, UnitCannotRun)
            self.close()
            raise
        self._restarter.start()
        roles = ", ".join(f"{n} ({u.args.role})" for n, u in self.units.items())
        for name, where in self.launcher.placement().items():
            self._progress(f"placement: {name} -> {where}")
        self._progress(f"ready: {len(self.units)} units over {self.provider}: {roles}; logs in {self.log_dir}")

    def _start_kv_store(self) -> None:
        """`$.kv.tiers.store: launch`: start the deployment's KV store and give the units its address in their
        spec. It outlives restarted units (their pages stay hits) and stops with the runtime."""
        tiers = self.spec.kv.tiers
        if tiers.store != "launch":
            return
        from disaggsdk.launch.kv_store_server import start_kv_store

        self._kv_store = start_kv_store(maxmemory_bytes=int(tiers.store_gb * 10**9))
        self.spec = attrs.evolve(self.spec, kv=attrs.evolve(
            self.spec.kv, tiers=attrs.evolve(tiers, store=self._kv_store.address)))
        self._progress(f"KV store: {self._kv_store.address} ({tiers.store_gb:g} GB, least recently used pages evicted)")

    # the Runtime seam

    def unit_roles(self) -> dict[str, str]:
        """Every unit's role by name, in start order (prefill units first)."""
        return {name: u.args.role for name, u in self.units.items()}

    def is_healthy(self, unit: str) -> bool:
        """Whether ``unit`` is alive, not reported down, not stalled (its loop silent for
        `$.serve.unit_stall_s`) and not unreachable (its channel silent for `$.serve.unit_unreachable_s`)."""
        return self.units[unit].healthy and not self._stalls.is_silent(unit) and not self._reach.is_silent(unit)

    def may_recover(self, unit: str) -> bool:
        """Whether ``unit`` is healthy, being restarted, or still has restarts left."""
        u = self.units[unit]
        return u.healthy or unit in self._restarting or self._restarts[unit].allows()

    def listen(self, on_message: MessageListener, on_unit_down: DownListener) -> None:
        """Deliver every unit message and death to the listeners from one reader thread.

        Raises:
            LaunchError: called twice.
        """
        if self._reader is not None:
            raise LaunchError("this runtime already has a listener")
        self._on_message, self._on_unit_down = on_message, on_unit_down
        now_s = time.monotonic()
        for name in self.units:  # silence is counted from here: nobody read the units before
            self._stalls.restarted(name, now_s)
            self._reach.restarted(name, now_s)
        self._reader = threading.Thread(target=self._read_loop, name="disaggsdk-runtime-reader", daemon=True)
        self._reader.start()

    def send(self, unit: str, message: ch.ToUnit) -> bool:
        """Send ``message`` to ``unit``; False (dropped) when the unit is down."""
        u = self.units[unit]
        if not u.healthy or self._closed:
            return False
        try:
            u.channel.send(message)
        except ChannelClosed:
            return False
        return True

    def placement(self) -> dict[str, str]:
        """Unit name -> where it runs, when the launcher places units beyond this machine (else {})."""
        return self.launcher.placement()

    def compile_stages(self) -> dict[str, str | None]:
        """Each unit's step compile as it last said: None (it does not compile), "compiling" (in the
        background, serving eagerly meanwhile), "compiled" or "compile_failed"."""
        return {name: u.compile_stage for name, u in self.units.items()}

    def wait_until_compiled(self, timeout_s: float) -> dict[str, str | None]:
        """Block until no unit is still compiling (or ``timeout_s`` passed): what a benchmark of the
        deployment's steady speed waits for (engine.background_compile). Returns `compile_stages`."""
        deadline = time.monotonic() + timeout_s
        while (any(stage == "compiling" for stage in self.compile_stages().values())
               and time.monotonic() < deadline and not self._closed):
            time.sleep(0.2)
        return self.compile_stages()

    def unit_cpu_s(self) -> dict[str, float]:
        """CPU seconds each live unit (with its tp workers) has used so far, by unit name."""
        return {name: process_tree_cpu_s(u.process.pid) for name, u in self.units.items()
                if u.process.pid > 0 and u.process.is_alive()}

    def kill_unit(self, name: str) -> None:
        """SIGKILL one unit (fault-injection for tests and demos); its death is handled as a crash."""
        self.units[name].process.kill()

    def close(self) -> None:
        """Stop every unit (politely, then by force). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        if not self._started:
            return
        for u in list(self._rejoining.values()):
            u.process.kill()  # its handshake fails at once; the restart thread stops it
        stop_units(self.units)
        if self._restarter.is_alive():
            self._restarts_due.put(None)
            self._restarter.join(timeout=30)
        self.launcher.close()  # after restarts: none starts later
        if self._kv_store is not None:
            self._kv_store.stop()  # after the units: none writes to it any more
        if self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
        if (self._own_log_dir and self.log_dir is not None and not self.failures
                and not any(u.fatal for u in self.units.values())):
            shutil.rmtree(self.log_dir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the reader thread

    def _read_loop(self) -> None:
        while not self._closed:
            live = [u for u in self.units.values() if u.healthy]
            if not live:
                time.sleep(0.05)
                continue
            by_channel = {u.channel.fileno(): u for u in live}
            # a unit on another machine has no sentinel here: its channel's end says it died
            by_sentinel = {sentinel: u for u in live if (sentinel := u.process.sentinel) is not None}
            try:
                ready = wait_any([*by_channel, *by_sentinel], timeout=0.2)
            except (OSError, ValueError):  # a channel closed under us: the next round sees why
                continue
            for fd in ready:
                assert isinstance(fd, int)  # wait_any hands back what it was given
                u = by_channel.get(fd) or by_sentinel[fd]
                if self._drain(u) or fd in by_sentinel:
                    self._unit_died(u)
            self._watch_stalls([u.args.name for u in live if u.healthy])

    def _watch_stalls(self, live: list[str]) -> None:
        """Report units silent for `$.serve.unit_unreachable_s`; ask those whose loops are silent for
        their stats, and report them silent for `$.serve.unit_stall_s`. An unreachable unit is not
        also reported stalled, nor asked: nothing reaches it.

        Silence is judged as of a moment taken before every channel is read once more: this thread
        may have been held up since it last read them (another thread of this process holding the
        GIL, a paused process), and what the units sent meanwhile waits in their channels; a unit is
        silent only when nothing of it waits, so this process's own stall is never taken for theirs."""
        now_s = time.monotonic()
        for name in live:
            u = self.units[name]
            if u.healthy and self._has_waiting_frames(u) and self._drain(u):
                self._unit_died(u)
        live = [name for name in live if self.units[name].healthy]
        for name in self._reach.newly_silent(live, now_s):
            silent_s = self._reach.silent_s(name, now_s)
            self._say(f"unit {name} unreachable: nothing heard from it for {silent_s:.1f} s, not even its heartbeat "
                      "(serve.unit_unreachable_s); it takes no new requests, and those it held are moved or ended")
            self._on_message(name, UnitUnreachable(silent_s))
        stalled, probe = self._stalls.check([n for n in live if not self._reach.is_silent(n)], now_s)
        for name in probe:
            self.send(name, ch.GetStats(0))
        for name in stalled:
            silent_s = self._stalls.silent_s(name, now_s)
            self._say(f"unit {name} stalled: nothing heard from it for {silent_s:.1f} s (serve.unit_stall_s); "
                      "it takes no new requests until it speaks again")
            self._on_message(name, UnitStalled(silent_s))

    @staticmethod
    def _has_waiting_frames(u: UnitHandle) -> bool:
        try:
            return u.channel.poll(0)
        except (ChannelClosed, ChannelError, OSError):
            return True  # `_drain` finds out what it is

    def _drain(self, u: UnitHandle) -> bool:
        """Deliver every whole frame ``u`` sent; True when its channel is closed or broken."""
        name = u.args.name
        try:
            heard = progressed = False
            while u.channel.poll(0):
                heard = True
                msg = u.channel.recv()
                if not isinstance(msg, ch.Heartbeat):  # the runtime's alone: no listener needs it
                    progressed = True
                    self._deliver(u, msg)
            now_s = time.monotonic()
            if heard and self._reach.heard(name, now_s):
                # its loop's silence counts from now: nothing asked it for stats while it was cut off
                self._stalls.restarted(name, now_s)
                self._say(f"unit {name} is reachable again: it takes requests again")
            elif progressed and self._stalls.heard(name, now_s):
                self._say(f"unit {name} speaks again: it takes requests again")
        except ChannelClosed:
            return True
        except ChannelError as exc:  # a unit that speaks garbage is treated as dead
            u.fatal = u.fatal or f"unreadable frame: {exc}"
            u.process.kill()
            return True
        return False

    def _deliver(self, u: UnitHandle, msg: ch.FromUnit) -> None:
        if isinstance(msg, ch.RoleChanged):
            # from now on it is that role: its restarts too, and every other unit hears its new info
            u.args, u.info = msgspec.structs.replace(u.args, role=msg.info.role), msg.info
            self._say(f"unit {u.args.name} serves as {msg.info.role} now")
            for other in self.units.values():
                if other is not u:
                    self.send(other.args.name, ch.PeerUp(msg.info))
        elif isinstance(msg, ch.Progress):  # a background compile ended after the unit was ready
            if msg.stage != "loading":
                u.compile_stage = msg.stage
            self._progress(progress_line(msg))
        elif isinstance(msg, ch.Fatal):
            u.fatal = msg.message
        elif isinstance(msg, ch.TransportStuck):
            u.fatal = f"its transport thread was stuck {msg.stuck_s:.1f} s inside libfabric"
            if msg.poisoned_peer:
                u.fatal += f" sending to {msg.poisoned_peer}"
                replace_poisoned_peer(self.units, msg.poisoned_peer, u.args.name, self._say)
        self._on_message(u.args.name, msg)

    def _unit_died(self, u: UnitHandle) -> None:
        if self._closed or not u.healthy:
            return
        will_restart = self._restarts[u.args.name].allows()
        if will_restart:  # before it reads unhealthy: a watcher never sees it down and not restarting
            self._restarting.add(u.args.name)
        u.healthy = False
        u.process.join(5)
        remove_fabric_shm(u.process.pid)
        report = (f"unit {u.args.name} ({u.args.role}) died with exit code {u.process.exitcode}"
                  f"{': ' + u.fatal if u.fatal else ''}; last lines of {u.args.log_path}:\n"
                  f"{unit_log_tail(u)}")
        u.exit_report = report
        self.failures.append(report)
        self._say(report)
        for other in self.units.values():
            self.send(other.args.name, ch.PeerDown(u.args.name))
        self._on_unit_down(u.args.name, UnitDown(report, collateral=u.stopped_with_group))
        if will_restart:
            self._queue_restart(u)

    def _queue_restart(self, u: UnitHandle) -> None:
        """Queue ``u``'s restart; a rank of a lock-step dp group takes its whole group with it: the
        others cannot step without it (their next collective fails) and a lone newcomer cannot join
        their process group, so they are stopped now and all start again together."""
        address = u.args.group_address
        if address is None:
            self._restarts_due.put([u.args])
            return
        if address in self._groups_due:
            return  # a member killed below, or one that died with the first: its group is queued already
        self._groups_due.add(address)
        group = [o for o in self.units.values() if o.args.group_address == address]
        for other in group:
            if other is not u and other.process.is_alive():
                other.fatal = other.fatal or f"stopped with its lock-step dp group: {u.args.name} died"
                other.stopped_with_group = True
                other.process.kill()
        self._restarts_due.put([o.args for o in group])

    def _restart_loop(self) -> None:
        while (group := self._restarts_due.get()) is not None:
            self._restart(group)

    def _restart(self, group: list[ch.UnitArgs]) -> None:
        """Start dead units again, together (one unit, or a lock-step dp group: every member is
        spawned before any handshake, since none finishes starting until all have joined; a group
        meets at a new address), bounded by the first's restart budget, with back-off; then tell
        the others they are back."""
        names = [args.name for args in group]
        lead, queued_address = names[0], group[0].group_address
        try:
            while self._restarts[lead].allows() and not self._closed:
                attempt = self._restarts[lead].spend()
                for name in names[1:]:
                    self._restarts[name].spend()
                if self._closing.wait(RESTART_BACKOFF_S * 2 ** (attempt - 1)):
                    return
                if len(group) > 1:
                    address = free_loopback_address()
                    group = [msgspec.structs.replace(args, group_address=address) for args in group]
                started: dict[str, UnitHandle] = {}
                try:  # a launcher may refuse the start itself (a Ray node lost: not the plan's node)
                    for args in group:
                        started[args.name] = self._rejoining[args.name] = self.launcher.spawn(args)
                    infos = []
                    for u in started.values():  # each learns the live units and the members back before it
                        back = [o for o in started.values() if o.info is not None]
                        infos.append(rejoin_unit(u, [o for o in self.units.values() if o.healthy] + back,
                                                 self._start_timeout_s, self._say))
                except Exception as exc:  # noqa: BLE001 - a failed restart is reported and tried again
                    stop_units(started, timeout_s=1.0)
                    self._say(f"restart {attempt} of unit{'s' if len(names) > 1 else ''} {', '.join(names)} "
                              f"failed: {exc}")
                    continue
                finally:
                    for name in names:
                        self._rejoining.pop(name, None)
                if self._closed:
                    stop_units(started)
                    return
                for name, u in started.items():
                    self._stalls.restarted(name, time.monotonic())
                    self._reach.restarted(name, time.monotonic())
                    old, self.units[name] = self.units[name], u
                    old.channel.close()
                for info in infos:
                    for other in self.units.values():
                        if other.args.name not in started:
                            self.send(other.args.name, ch.PeerUp(info))
                for name, info in zip(names, infos):
                    self._say(f"unit {name} restarted ({attempt} of {self.max_restarts} within "
                              f"{self._restarts[name].window_s:g} s), incarnation {info.incarnation}")
                return
            self._say(f"unit{'s' if len(names) > 1 else ''} {', '.join(names)} stay{'' if len(names) > 1 else 's'} "
                      f"down: {self.max_restarts} restarts used within {self._restarts[lead].window_s:g} s")
        finally:
            for name in names:
                self._restarting.discard(name)
            if queued_address is not None:
                self._groups_due.discard(queued_address)
